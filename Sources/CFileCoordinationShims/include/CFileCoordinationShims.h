// Thin wrappers over Linux calls that Swift cannot reach directly: variadic open and
// fcntl, preadv2's flags, O_TMPFILE and open-file-description (OFD) locks.
#ifndef FILECOORDINATION_SHIMS_H
#define FILECOORDINATION_SHIMS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/// open(2) with an explicit mode. Returns the descriptor or -1 with errno set.
int fc_open(const char *path, int flags, unsigned int mode);
/// openat(2) with an explicit mode.
int fc_openat(int dirfd, const char *path, int flags, unsigned int mode);
/// Opens an unnamed temporary file (O_TMPFILE) in `directory` for writing.
int fc_open_tmpfile(const char *directory, unsigned int mode);
/// preadv2(2) with RWF_NOWAIT: reads only what is already in the page cache and
/// returns -1/EAGAIN instead of blocking on the device.
ssize_t fc_pread_nowait(int fd, void *buffer, size_t count, int64_t offset);
/// Sets or clears O_NONBLOCK on an open descriptor.
int fc_set_nonblocking(int fd, int on);
/// Takes (type F_RDLCK / F_WRLCK) or releases (F_UNLCK) an OFD lock on [start, start+length).
/// `wait` selects F_OFD_SETLKW over F_OFD_SETLK.
int fc_ofd_lock(int fd, short type, int64_t start, int64_t length, int wait);
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
extern const int fc_O_DIRECTORY;
extern const int fc_AT_SYMLINK_FOLLOW;
extern const int fc_AT_FDCWD;
extern const short fc_F_RDLCK;
extern const short fc_F_WRLCK;
extern const short fc_F_UNLCK;

/// Notes what a command run by `filecoord exec` must inherit from this process's own
/// start: the signals ignored then (`nohup`, a shell's background job) and the
/// descriptors open then (3 and up, with their files' identities). Also unblocks SIGINT,
/// SIGTERM, SIGHUP and SIGQUIT in the calling thread, and so in every thread it starts
/// after: a process started from a thread that blocks them (any libdispatch worker, so
/// any Swift task that runs `Process`) inherits the mask. Call first in main.
void fc_note_startup(void);
/// Whether signal `number` was ignored when this process started (per `fc_note_startup`).
int fc_ignored_at_start(int number);
/// posix_spawnp for `exec`: no signal blocked; the signals this process ignores that were
/// not ignored at its start reset to default; the descriptors noted at start passed on
/// (when still the same files), and the `kept_count` descriptors of `kept` (this
/// process's own, passed on on purpose), every other one closed. Returns 0 or an errno value.
int fc_spawn_command(pid_t *pid, const char *file, char *const argv[], char *const envp[], const int *kept, int kept_count);
/// From now until `fc_wait_command` returns (or `fc_forward_signals_end`), SIGINT,
/// SIGTERM, SIGHUP and SIGQUIT (those not ignored) sent by another process are passed on
/// to the command; those a terminal sent (to the whole process group, the command
/// included) are dropped. Either way this process does not die of them meanwhile. One
/// that comes before the command's pid is known is passed on once it is.
void fc_forward_signals_begin(void);
/// The command's pid, once started.
void fc_forward_signals_to(pid_t pid);
/// Puts the previous handlers back; a signal that came while the command could not be
/// started is raised in this process.
void fc_forward_signals_end(void);
/// Waits for the command, stops forwarding before reaping it, and returns its exit
/// status (128+N for signal N), or -errno.
int fc_wait_command(pid_t pid);

/// Catches the `count` signals in `numbers` with a handler that writes each one's number
/// (one byte) into a pipe, and returns the pipe's read end (-1 with errno set on
/// failure). Whichever thread the kernel picks runs the handler, so none is lost; the
/// reader learns of it by reading the pipe. Every call returns the same pipe.
int fc_catch_signals(const int *numbers, int count);
/// Puts the default action back for the `count` signals in `numbers`.
void fc_uncatch_signals(const int *numbers, int count);

/// ThreadSanitizer annotations: `address` is acquired (the calling thread sees what was
/// written before the last release of it) or released. They do nothing unless this file
/// is compiled with `-fsanitize=thread` (`swift build --sanitize=thread`): the sanitizer
/// does not see `Synchronization.Mutex` (a futex in an uninstrumented library) as a lock.
void fc_tsan_acquire(void *address);
void fc_tsan_release(void *address);

#endif
