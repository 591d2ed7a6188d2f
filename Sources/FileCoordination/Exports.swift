@_exported import AsyncFileIO
