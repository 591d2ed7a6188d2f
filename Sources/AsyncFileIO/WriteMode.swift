/// Marks an ``AsyncFileStream`` opened for writing: only the write methods are available.
public enum WriteMode {}
