/// Marks an ``AsyncFileStream`` opened for reading: only the read methods are available.
public enum ReadMode {}
