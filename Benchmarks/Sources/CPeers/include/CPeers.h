// The practical limits the benchmark compares against, in plain C.
#ifndef FILECOORD_BENCH_CPEERS_H
#define FILECOORD_BENCH_CPEERS_H
#include <stddef.h>
#include <stdint.h>

/// Reads every file (open, fstat, read, close) on `threads` pthreads that take the next
/// path from a shared counter. Returns the bytes read; *checksum gets first+last+size sums.
int64_t peer_read_files(const char *const *paths, size_t count, int threads, uint64_t *checksum);

/// `peer_read_files` delivering each file to one consumer, as an API that hands over
/// every file's bytes must: a malloc'ed buffer per file, passed to the calling thread in
/// groups of 16 through a bounded ring; the caller digests and frees each.
int64_t peer_read_files_handoff(const char *const *paths, size_t count, int threads, uint64_t *checksum);

/// Streams every file through one reused buffer of `chunk` bytes per thread (open, read(2)
/// until the end, close), on `threads` pthreads that take the next path from a shared
/// counter: what a program that hashes, scans or copies large files does. Returns the
/// bytes read; *checksum gets, per chunk, its first and last byte and its size, summed.
int64_t peer_stream_files(const char *const *paths, size_t count, int threads, size_t chunk, uint64_t *checksum);

/// `peer_read_files` under a claim per file, as the coordination space takes it: a shared
/// OFD lock (`F_OFD_SETLK`, `F_RDLCK`) on the file's one byte in one of the 64 shard
/// files `shard_directory/00` to `3f` (created when missing), the byte and the shard from
/// the path's hash as docs/protocol.md gives them, taken before the file is read and
/// released after. With `files_per_lock` > 1, a thread takes that many consecutive files
/// at a time under one lock, on the byte of the first one's directory (a claim that
/// covers a group). The shards are opened once, shared by all threads. Returns the bytes
/// read, or -1 when a shard cannot be opened or a lock call fails.
int64_t peer_read_files_locked(const char *const *paths, size_t count, int threads, const char *shard_directory,
                               int files_per_lock, uint64_t *checksum);

/// `count` random 4 KiB preads at 4 KiB-aligned offsets of `fd` (file of `size` bytes),
/// split over `threads` threads. Returns a checksum of one byte per read.
uint64_t peer_random_reads(int fd, int64_t size, long count, int threads, unsigned seed);

/// The floor of a message and its answer between two processes through inotify: `rounds`
/// round trips with a child this forks. Each way, one process writes a byte into a file
/// the other watches (open, pwrite, close: IN_CLOSE_WRITE; the file is never truncated)
/// and the other, blocked in `read` of its inotify descriptor, wakes and answers. Before
/// each round trip the parent sleeps `pause_microseconds` (0: none), as a writer after a
/// pause does. The files go in `directory`. `microseconds` gets each round trip (the
/// pause not included). Returns 0, or -1.
int peer_inotify_round_trips(const char *directory, int rounds, int pause_microseconds, double *microseconds);

/// The bytes this process's `malloc` has handed out and not had back, in all arenas and
/// its mapped blocks (glibc's `mallinfo2`).
size_t peer_heap_in_use(void);

/// Runs the command `argv` (argv[0] a path) `runs_each` times in a row on each of
/// `workers` threads at once, each run a process (posix_spawn, waitpid), its output and
/// errors to /dev/null: N concurrent shell loops, as `make -j` or `xargs -P` start commands.
/// *seconds gets the wall time of the whole, *longest_microseconds the longest single
/// run (spawn to exit). Returns how many runs failed (did not start or exit 0).
int peer_run_concurrently(char *const *argv, int workers, int runs_each, double *seconds, double *longest_microseconds);
/// `processes` processes (forked) of `threads` threads each, every thread making `each`
/// increments of the decimal counter in the file at `path`: open, flock(LOCK_EX), read,
/// write the next value (opened again with O_TRUNC, as a shell's `>` does), unlock, close. The whole run's seconds, and the longest
/// wait for the lock (microseconds). Returns the number of failed increments.
int peer_flock_threads(const char *path, int processes, int threads, int each, double *seconds, double *longest_wait_microseconds);
#endif
