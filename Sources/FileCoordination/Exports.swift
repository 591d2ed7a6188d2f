// `import FileCoordination` gives the whole public API: the async file I/O layer and
// file watching are re-exported from here.
@_exported import AsyncFileIO
@_exported import FileWatching
@_exported import SystemPackage
