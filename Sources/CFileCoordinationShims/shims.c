#define _GNU_SOURCE
#include <sys/mman.h>
#include "CFileCoordinationShims.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/uio.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

const int fc_O_TMPFILE = O_TMPFILE;
const int fc_O_PATH = O_PATH;
const int fc_O_NOFOLLOW = O_NOFOLLOW;
const int fc_O_NOATIME = O_NOATIME;
const int fc_O_DIRECTORY = O_DIRECTORY;
const int fc_AT_SYMLINK_FOLLOW = AT_SYMLINK_FOLLOW;
const int fc_AT_FDCWD = AT_FDCWD;
const short fc_F_RDLCK = F_RDLCK;
const short fc_F_WRLCK = F_WRLCK;
const short fc_F_UNLCK = F_UNLCK;

int fc_open(const char *path, int flags, unsigned int mode) {
    return open(path, flags, (mode_t)mode);
}

int fc_openat(int dirfd, const char *path, int flags, unsigned int mode) {
    return openat(dirfd, path, flags, (mode_t)mode);
}

int fc_open_tmpfile(const char *directory, unsigned int mode) {
    return open(directory, O_TMPFILE | O_WRONLY | O_CLOEXEC, (mode_t)mode);
}

ssize_t fc_pread_nowait(int fd, void *buffer, size_t count, int64_t offset) {
    struct iovec iov = { buffer, count };
    return preadv2(fd, &iov, 1, (off_t)offset, RWF_NOWAIT);
}

int fc_openat2_cached(int dirfd, const char *path, int flags, int same_mount) {
#ifdef SYS_openat2
    /* struct open_how of <linux/openat2.h>: flags, mode, resolve. */
    struct { uint64_t flags, mode, resolve; } how = {
        (uint64_t)(unsigned)(flags | O_CLOEXEC), 0, 0x20 /* RESOLVE_CACHED */ | (same_mount ? 0x01 /* RESOLVE_NO_XDEV */ : 0)
    };
    return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
#else
    (void)dirfd; (void)path; (void)flags; (void)same_mount;
    errno = ENOSYS;
    return -1;
#endif
}

#ifndef STATX_MNT_ID
#define STATX_MNT_ID 0x1000U /* <linux/stat.h>, Linux 5.8 */
#endif
#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x4000U /* Linux 6.8: an ID never given to another mount */
#endif

int fc_device_cached(int dirfd, const char *path, unsigned int *major, unsigned int *minor, uint64_t *mount_id) {
    struct statx info;
    /* (An older kernel ignores the bit it does not know, and answers STATX_MNT_ID.) */
    if (statx(dirfd, path, AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_MNT_ID | STATX_MNT_ID_UNIQUE, &info) != 0) return -1;
    *major = info.stx_dev_major;
    *minor = info.stx_dev_minor;
    *mount_id = (info.stx_mask & (STATX_MNT_ID | STATX_MNT_ID_UNIQUE)) ? info.stx_mnt_id : 0;
    return 0;
}

uint64_t fc_device_number(unsigned int major, unsigned int minor) {
    return makedev(major, minor);
}

uint64_t *fc_thread_read_run(void) {
    static __thread uint64_t run[3];
    return run;
}

int fc_set_nonblocking(int fd, int on) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return -1;
    flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
    return fcntl(fd, F_SETFL, flags);
}

int fc_ofd_lock(int fd, short type, int64_t start, int64_t length, int wait) {
    struct flock lock = { .l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)start, .l_len = (off_t)length, .l_pid = 0 };
    return fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &lock);
}

int fc_ofd_getlock(int fd, short type, int64_t start, int64_t length, short *conflicting) {
    struct flock lock = { .l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)start, .l_len = (off_t)length, .l_pid = 0 };
    int r = fcntl(fd, F_OFD_GETLK, &lock);
    if (r == 0 && conflicting) *conflicting = lock.l_type;
    return r;
}

static void fc_lock_wait_handler(int signal) { (void)signal; }

static pthread_once_t fc_lock_wait_once = PTHREAD_ONCE_INIT;
static int fc_lock_wait_number = -1;

static void fc_lock_wait_install(void) {
    for (int number = SIGRTMAX - 2; number >= SIGRTMIN + 4; number--) {
        struct sigaction current;
        if (sigaction(number, NULL, &current) != 0 || (current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL) continue;
        struct sigaction action = { 0 };
        action.sa_handler = fc_lock_wait_handler;
        sigemptyset(&action.sa_mask);
        action.sa_flags = 0; /* no SA_RESTART: the blocked call returns EINTR */
        if (sigaction(number, &action, NULL) == 0) {
            fc_lock_wait_number = number;
            return;
        }
    }
}

int fc_lock_wait_signal(void) {
    pthread_once(&fc_lock_wait_once, fc_lock_wait_install);
    return fc_lock_wait_number;
}

void fc_block_all_signals_but(int signal) {
    sigset_t set;
    sigfillset(&set);
    sigdelset(&set, signal);
    pthread_sigmask(SIG_SETMASK, &set, NULL);
}

int fc_signal_thread(pthread_t thread, int signal) {
    return pthread_kill(thread, signal);
}

int fc_rename_noreplace(const char *from, const char *to) {
    return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
}

void fc_set_thread_name(const char *name) {
    char buffer[16];
    snprintf(buffer, sizeof buffer, "%s", name);
    pthread_setname_np(pthread_self(), buffer);
}

int fc_get_thread_name(char *buffer, size_t size) {
    return pthread_getname_np(pthread_self(), buffer, size);
}

uint64_t fc_atomic_load_u64(const uint64_t *word) {
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

uint64_t fc_atomic_add_u64(uint64_t *word, uint64_t value) {
    return __atomic_add_fetch(word, value, __ATOMIC_ACQ_REL);
}

void *fc_map_shared(int fd, size_t length) {
    void *p = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FC_TSAN 1
#endif
#endif

#ifdef FC_TSAN
void __tsan_acquire(void *address);
void __tsan_release(void *address);
void fc_tsan_acquire(void *address) { __tsan_acquire(address); }
void fc_tsan_release(void *address) { __tsan_release(address); }
#else
void fc_tsan_acquire(void *address) { (void)address; }
void fc_tsan_release(void *address) { (void)address; }
#endif
