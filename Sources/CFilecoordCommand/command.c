#define _GNU_SOURCE
#include "CFilecoordCommand.h"
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/close_range.h>
#include <dirent.h>

// MARK: exec's command

enum { fc_max_inherited = 256 };
static sigset_t fc_ignored_at_start_set;
/// The signals `exec` passes on to its command, and that every filecoord process unblocks.
static const int fc_forwarded[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT };
enum { fc_forwarded_count = sizeof fc_forwarded / sizeof fc_forwarded[0] };
static int fc_inherited_count;
/// Bit N: descriptor N (0, 1, 2) was closed when this process started.
static int fc_closed_standard;

int fc_standard_descriptor_was_closed(int fd) {
    return fd >= 0 && fd <= 2 && (fc_closed_standard & (1 << fd)) != 0;
}
static struct { int fd; dev_t dev; ino_t ino; } fc_inherited[fc_max_inherited];

int fc_ignored_at_start(int number) {
    return sigismember(&fc_ignored_at_start_set, number) == 1;
}

void fc_limit_malloc_arenas(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    mallopt(M_ARENA_MAX, cores < 2 ? 2 : (int)cores);
}

void fc_note_startup(void) {
    // A standard descriptor closed at start (`<&-`) would be the next file opened: stdin
    // would read the coordination space's files, stdout write into them. /dev/null takes
    // its place, and the command says that it was closed when it needs it.
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int opened = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (opened == fd) fc_closed_standard |= 1 << fd;
        else if (opened >= 0) close(opened);
    }
    sigset_t handled;
    sigemptyset(&handled);
    for (int index = 0; index < fc_forwarded_count; index++) sigaddset(&handled, fc_forwarded[index]);
    pthread_sigmask(SIG_UNBLOCK, &handled, NULL);
    sigemptyset(&fc_ignored_at_start_set);
    for (int number = 1; number < 32; number++) {
        struct sigaction action;
        if (sigaction(number, NULL, &action) == 0 && action.sa_handler == SIG_IGN) sigaddset(&fc_ignored_at_start_set, number);
    }
    // The Swift runtime's backtracer catches SIGQUIT, prints a crash report and lets the
    // process run on: Ctrl-\ would not end a command. It ends it, as the other
    // terminating signals do (a command that catches them catches it too).
    if (!sigismember(&fc_ignored_at_start_set, SIGQUIT)) signal(SIGQUIT, SIG_DFL);
    DIR *directory = opendir("/proc/self/fd");
    if (directory == NULL) return;
    int own = dirfd(directory);
    struct dirent *entry;
    while ((entry = readdir(directory)) != NULL && fc_inherited_count < fc_max_inherited) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        int fd = atoi(entry->d_name);
        struct stat info;
        if (fd < 3 || fd == own || fstat(fd, &info) != 0) continue;
        fc_inherited[fc_inherited_count].fd = fd;
        fc_inherited[fc_inherited_count].dev = info.st_dev;
        fc_inherited[fc_inherited_count].ino = info.st_ino;
        fc_inherited_count++;
    }
    closedir(directory);
}

int fc_spawn_command(pid_t *pid, const char *file, char *const argv[], char *const envp[], const int *kept, int kept_count,
                     int stdin_fd) {
    // Every descriptor of this process's own (libinotifytools' among them) stays out.
    syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (stdin_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdin_fd, 0);
    for (int index = 0; index < fc_inherited_count; index++) {
        struct stat info;
        int fd = fc_inherited[index].fd;
        if (fstat(fd, &info) != 0 || info.st_dev != fc_inherited[index].dev || info.st_ino != fc_inherited[index].ino) continue;
        // dup2 onto itself clears close-on-exec in the child (POSIX 2018, glibc 2.29).
        posix_spawn_file_actions_adddup2(&actions, fd, fd);
    }
    for (int index = 0; index < kept_count; index++) posix_spawn_file_actions_adddup2(&actions, kept[index], kept[index]);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t none, reset;
    sigemptyset(&none);
    sigemptyset(&reset);
    for (int number = 1; number < 32; number++) {
        struct sigaction action;
        if (number == SIGKILL || number == SIGSTOP) continue;
        if (sigaction(number, NULL, &action) == 0 && action.sa_handler == SIG_IGN && !sigismember(&fc_ignored_at_start_set, number))
            sigaddset(&reset, number);
    }
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setsigdefault(&attributes, &reset);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    int result = posix_spawnp(pid, file, &actions, &attributes, argv, envp);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    return result;
}

/// 0: not forwarding; -1: the command is being started (a signal waits in
/// fc_pending_signal); above 0: the command. Both are read in a signal handler and
/// written by other threads: every access is atomic (lock-free for an int).
static int fc_forward_pid;
static int fc_pending_signal;
static struct sigaction fc_previous[fc_forwarded_count];
static int fc_replaced[fc_forwarded_count];

static void fc_forward(int number, siginfo_t *info, void *context) {
    (void)context;
    int saved = errno;
    pid_t pid = (pid_t)__atomic_load_n(&fc_forward_pid, __ATOMIC_SEQ_CST);
    // si_code <= 0: sent by a process (kill, sigqueue, tgkill). A terminal's signal
    // (SI_KERNEL) went to the command's process group already.
    if (info != NULL && info->si_code <= 0) {
        if (pid > 0) kill(pid, number);
        else if (pid == -1) __atomic_store_n(&fc_pending_signal, number, __ATOMIC_SEQ_CST);
    }
    errno = saved;
}

void fc_forward_signals_begin(void) {
    __atomic_store_n(&fc_pending_signal, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fc_forward_pid, -1, __ATOMIC_SEQ_CST);
    for (int index = 0; index < fc_forwarded_count; index++) {
        struct sigaction forward;
        fc_replaced[index] = 0;
        if (sigaction(fc_forwarded[index], NULL, &fc_previous[index]) != 0 || fc_previous[index].sa_handler == SIG_IGN) continue;
        memset(&forward, 0, sizeof forward);
        forward.sa_sigaction = fc_forward;
        forward.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&forward.sa_mask);
        fc_replaced[index] = sigaction(fc_forwarded[index], &forward, NULL) == 0;
    }
}

void fc_forward_signals_to(pid_t pid) {
    __atomic_store_n(&fc_forward_pid, pid, __ATOMIC_SEQ_CST);
    int pending = __atomic_exchange_n(&fc_pending_signal, 0, __ATOMIC_SEQ_CST);
    if (pending) kill(pid, pending);
}

void fc_forward_signals_end(void) {
    __atomic_store_n(&fc_forward_pid, 0, __ATOMIC_SEQ_CST);
    for (int index = 0; index < fc_forwarded_count; index++) {
        if (fc_replaced[index]) sigaction(fc_forwarded[index], &fc_previous[index], NULL);
        fc_replaced[index] = 0;
    }
    // Sent while the command was being started, which failed: this process's own now.
    int pending = __atomic_exchange_n(&fc_pending_signal, 0, __ATOMIC_SEQ_CST);
    if (pending) raise(pending);
}

// Written by the thread that waited for the command, read by the task it resumed.
static int fc_last_signal;

int fc_last_command_signal(void) {
    return __atomic_load_n(&fc_last_signal, __ATOMIC_ACQUIRE);
}

int fc_wait_command(pid_t pid) {
    // Waited for without reaping it first, so that no signal is passed on to another
    // process that gets the number once it is reaped.
    siginfo_t info;
    while (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) != 0) {
        if (errno != EINTR) return -errno;
    }
    fc_forward_signals_end();
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return -errno;
    }
    __atomic_store_n(&fc_last_signal, WIFSIGNALED(status) ? WTERMSIG(status) : 0, __ATOMIC_RELEASE);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}


void fc_die_by_signal(int number) {
    // A process that has cleaned up after SIGQUIT leaves no core behind.
    if (number == SIGQUIT) {
        struct rlimit none = { 0, 0 };
        setrlimit(RLIMIT_CORE, &none);
    }
    signal(number, SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, number);
    pthread_sigmask(SIG_UNBLOCK, &only, NULL);
    raise(number);
    // Not reached for a signal whose default action ends the process.
    _exit(128 + number);
}


// MARK: signals caught into a pipe

static int fc_caught_pipe[2] = { -1, -1 };

static void fc_catch(int number, siginfo_t *info, void *context) {
    (void)context;
    int saved = errno;
    // Bit 7: sent by the kernel (a terminal's Ctrl-C reaches the whole process group),
    // not by a process (si_code <= 0: kill, sigqueue).
    unsigned char byte = (unsigned char)number | (info != NULL && info->si_code > 0 ? 0x80 : 0);
    // Non-blocking: with the pipe full (thousands of signals not yet read) one is dropped.
    ssize_t written = write(fc_caught_pipe[1], &byte, 1);
    (void)written;
    errno = saved;
}

int fc_catch_signals(const int *numbers, int count) {
    if (fc_caught_pipe[0] < 0) {
        if (pipe2(fc_caught_pipe, O_CLOEXEC) != 0) return -1;
        if (fcntl(fc_caught_pipe[1], F_SETFL, O_NONBLOCK) != 0) return -1;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = fc_catch;
    action.sa_flags = SA_RESTART | SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    for (int index = 0; index < count; index++) sigaddset(&action.sa_mask, numbers[index]);
    for (int index = 0; index < count; index++) {
        if (sigaction(numbers[index], &action, NULL) != 0) return -1;
    }
    return fc_caught_pipe[0];
}

void fc_uncatch_signals(const int *numbers, int count) {
    for (int index = 0; index < count; index++) signal(numbers[index], SIG_DFL);
}

int fc_pipe_cloexec(int fds[2]) {
    return pipe2(fds, O_CLOEXEC);
}
