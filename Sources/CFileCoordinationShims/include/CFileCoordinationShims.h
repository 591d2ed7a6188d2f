// Thin wrappers over Linux calls that Swift cannot reach directly: variadic open and
// fcntl, preadv2's flags, O_TMPFILE and open-file-description (OFD) locks.
#ifndef FILECOORDINATION_SHIMS_H
#define FILECOORDINATION_SHIMS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <pthread.h>

/// open(2) with an explicit mode. Returns the descriptor or -1 with errno set.
int fc_open(const char *path, int flags, unsigned int mode);
/// openat(2) with an explicit mode.
int fc_openat(int dirfd, const char *path, int flags, unsigned int mode);
/// Opens an unnamed temporary file (O_TMPFILE) in `directory` for writing.
int fc_open_tmpfile(const char *directory, unsigned int mode);
/// preadv2(2) with RWF_NOWAIT: reads only what is already in the page cache and
/// returns -1/EAGAIN instead of blocking on the device.
ssize_t fc_pread_nowait(int fd, void *buffer, size_t count, int64_t offset);
/// openat2(2) that only resolves `path` from the kernel's lookup cache (RESOLVE_CACHED):
/// -1/EAGAIN instead of reading a directory from a device or asking a server. With
/// `same_mount`, a path crossing a mount point fails (RESOLVE_NO_XDEV; with EAGAIN, as
/// the lookup from the cache stops at the mount point).
/// O_CLOEXEC is added. -1/ENOSYS on kernels without openat2 (before 5.6; RESOLVE_CACHED
/// needs 5.12 and fails with EINVAL before).
int fc_openat2_cached(int dirfd, const char *path, int flags, int same_mount);
/// The device (major, minor) and the mount (its ID: never reused from Linux 6.8, reused
/// after an unmount before; 0 when the kernel does not say) holding the file at path
/// relative to dirfd (an empty path: dirfd's own file), from what the kernel has cached
/// (statx with AT_STATX_DONT_SYNC: no server is asked). 0, or -1 with errno set.
int fc_device_cached(int dirfd, const char *path, unsigned int *major, unsigned int *minor, uint64_t *mount_id);
/// The device number (dev_t, as stat's st_dev) of a major and minor.
uint64_t fc_device_number(unsigned int major, unsigned int minor);
/// This thread's own three words (when its run of reads without a yield began, its last
/// read, and how many files it opened in one call); Swift has no thread-local storage of
/// its own.
uint64_t *fc_thread_read_run(void);
/// Sets or clears O_NONBLOCK on an open descriptor.
int fc_set_nonblocking(int fd, int on);
/// Takes (type F_RDLCK / F_WRLCK) or releases (F_UNLCK) an OFD lock on [start, start+length).
/// `wait` selects F_OFD_SETLKW over F_OFD_SETLK.
int fc_ofd_lock(int fd, short type, int64_t start, int64_t length, int wait);
/// The signal that ends a blocked F_OFD_SETLKW on a thread of the library's own, chosen
/// and given its handler on the first call: the highest real-time signal from SIGRTMAX - 2
/// down to SIGRTMIN + 4 whose disposition is still the default, given a handler that does
/// nothing, installed without SA_RESTART (so the call fails with EINTR). -1 when every
/// candidate is taken. Thread-safe.
int fc_lock_wait_signal(void);
/// Blocks every signal in the calling thread except `signal`, which it unblocks.
void fc_block_all_signals_but(int signal);
/// Sends `signal` to `thread` (pthread_kill).
int fc_signal_thread(pthread_t thread, int signal);
/// Queries an OFD lock: returns 0 and sets *type to F_UNLCK when the range could be locked,
/// else the conflicting lock's type.
int fc_ofd_getlock(int fd, short type, int64_t start, int64_t length, short *conflicting);
/// renameat2(2) with RENAME_NOREPLACE.
int fc_rename_noreplace(const char *from, const char *to);
/// Names the calling thread (at most 15 bytes are kept).
void fc_set_thread_name(const char *name);
/// Writes the calling thread's name into `buffer` (at least 16 bytes).
int fc_get_thread_name(char *buffer, size_t size);

/// Atomic operations on a 64-bit word in memory shared between processes (an mmap'd
/// file in the coordination space).
uint64_t fc_atomic_load_u64(const uint64_t *word);
uint64_t fc_atomic_add_u64(uint64_t *word, uint64_t value);
/// Maps `length` bytes of `fd` shared and writable; NULL on failure (errno set).
void *fc_map_shared(int fd, size_t length);

/// Constants that Swift imports poorly or not at all.
extern const int fc_O_TMPFILE;
extern const int fc_O_PATH;
extern const int fc_O_NOFOLLOW;
extern const int fc_O_NOATIME;
extern const int fc_O_DIRECTORY;
extern const int fc_AT_SYMLINK_FOLLOW;
extern const int fc_AT_FDCWD;
extern const short fc_F_RDLCK;
extern const short fc_F_WRLCK;
extern const short fc_F_UNLCK;

/// ThreadSanitizer annotations: `address` is acquired (the calling thread sees what was
/// written before the last release of it) or released. They do nothing unless this file
/// is compiled with `-fsanitize=thread` (`swift build --sanitize=thread`): the sanitizer
/// does not see `Synchronization.Mutex` (a futex in an uninstrumented library) as a lock.
void fc_tsan_acquire(void *address);
void fc_tsan_release(void *address);

#endif
