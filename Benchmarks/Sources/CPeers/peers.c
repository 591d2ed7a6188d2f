#define _GNU_SOURCE
#include "CPeers.h"
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <time.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct files_job {
    const char *const *paths;
    size_t count;
    atomic_size_t next;
    atomic_llong bytes;
    atomic_ullong sum;
};

/* open, fstat, read up to the size at open, close. Into *buffer, replaced by a larger one
 * when *capacity is too small (a new one for every file when *capacity is 0). Returns the
 * bytes read, or -1 when the file could not be opened. */
static long long read_file(const char *path, unsigned char **buffer, size_t *capacity) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat info;
    if (fstat(fd, &info) != 0) { close(fd); return -1; }
    size_t want = (size_t)info.st_size;
    if (want > *capacity || *buffer == NULL) {
        free(*buffer);
        *capacity = want > *capacity ? want : *capacity;
        *buffer = malloc(*capacity ? *capacity : 1);
    }
    size_t got = 0;
    ssize_t n;
    while (got < want && (n = read(fd, *buffer + got, want - got)) > 0) got += (size_t)n;
    close(fd);
    return (long long)got;
}

static void *files_worker(void *raw) {
    struct files_job *job = raw;
    size_t capacity = 1 << 20;
    unsigned char *buffer = malloc(capacity);
    long long bytes = 0;
    unsigned long long sum = 0;
    for (;;) {
        size_t index = atomic_fetch_add(&job->next, 1);
        if (index >= job->count) break;
        long long read = read_file(job->paths[index], &buffer, &capacity);
        if (read < 0) continue;
        size_t got = (size_t)read;
        bytes += (long long)got;
        if (got) sum += buffer[0] + buffer[got - 1] + got;
    }
    atomic_fetch_add(&job->bytes, bytes);
    atomic_fetch_add(&job->sum, sum);
    free(buffer);
    return NULL;
}

/* Runs `worker` on `job` in `threads` threads (1 to 64) and waits for them all. */
static void run_pool(int threads, void *(*worker)(void *), void *job) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    pthread_t handles[64];
    for (int k = 0; k < threads; k++) pthread_create(&handles[k], NULL, worker, job);
    for (int k = 0; k < threads; k++) pthread_join(handles[k], NULL);
}

int64_t peer_read_files(const char *const *paths, size_t count, int threads, uint64_t *checksum) {
    struct files_job job = { paths, count, 0, 0, 0 };
    run_pool(threads, files_worker, &job);
    *checksum = atomic_load(&job.sum);
    return atomic_load(&job.bytes);
}

struct stream_job {
    const char *const *paths;
    size_t count, chunk;
    atomic_size_t next;
    atomic_llong bytes;
    atomic_ullong sum;
};

static void *stream_worker(void *raw) {
    struct stream_job *job = raw;
    unsigned char *buffer = malloc(job->chunk);
    long long bytes = 0;
    unsigned long long sum = 0;
    for (;;) {
        size_t index = atomic_fetch_add(&job->next, 1);
        if (index >= job->count) break;
        int fd = open(job->paths[index], O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n;
        while ((n = read(fd, buffer, job->chunk)) > 0) {
            bytes += n;
            sum += buffer[0] + buffer[n - 1] + (unsigned long long)n;
        }
        close(fd);
    }
    atomic_fetch_add(&job->bytes, bytes);
    atomic_fetch_add(&job->sum, sum);
    free(buffer);
    return NULL;
}

int64_t peer_stream_files(const char *const *paths, size_t count, int threads, size_t chunk, uint64_t *checksum) {
    struct stream_job job = { paths, count, chunk ? chunk : 1, 0, 0, 0 };
    run_pool(threads, stream_worker, &job);
    *checksum = atomic_load(&job.sum);
    return atomic_load(&job.bytes);
}

/* The claim's byte of the first `length` bytes of `path`, as the coordination space
 * computes a path's (docs/protocol.md): FNV-1a 64 over the bytes, then the first half of
 * the Murmur3 finalizer; the slot is at 4096 + 4 * (h >> 5) in shard (h >> 5) & 63, and a
 * read takes its first byte. */
static void claim_byte(const char *path, size_t length, int *shard, off_t *offset) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t k = 0; k < length; k++) h = (h ^ (unsigned char)path[k]) * 0x00000100000001b3ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    *shard = (int)((h >> 5) & 63);
    *offset = (off_t)(4096 + 4 * (h >> 5));
}

struct locked_job {
    struct files_job files;
    const int *shards;
    size_t group;
    atomic_int failures;
};

static int set_lock(int fd, short type, off_t offset) {
    struct flock lock = { .l_type = type, .l_whence = SEEK_SET, .l_start = offset, .l_len = 1 };
    return fcntl(fd, F_OFD_SETLK, &lock);
}

static void *locked_worker(void *raw) {
    struct locked_job *job = raw;
    size_t capacity = 1 << 20;
    unsigned char *buffer = malloc(capacity);
    long long bytes = 0;
    unsigned long long sum = 0;
    for (;;) {
        size_t first = atomic_fetch_add(&job->files.next, job->group);
        if (first >= job->files.count) break;
        size_t end = first + job->group < job->files.count ? first + job->group : job->files.count;
        const char *path = job->files.paths[first];
        size_t length = strlen(path);
        if (job->group > 1) {
            const char *slash = strrchr(path, '/');
            length = slash && slash != path ? (size_t)(slash - path) : 1;
        }
        int shard;
        off_t offset;
        claim_byte(path, length, &shard, &offset);
        if (set_lock(job->shards[shard], F_RDLCK, offset) != 0) { atomic_fetch_add(&job->failures, 1); continue; }
        for (size_t index = first; index < end; index++) {
            long long read = read_file(job->files.paths[index], &buffer, &capacity);
            if (read < 0) continue;
            size_t got = (size_t)read;
            bytes += (long long)got;
            if (got) sum += buffer[0] + buffer[got - 1] + got;
        }
        if (set_lock(job->shards[shard], F_UNLCK, offset) != 0) atomic_fetch_add(&job->failures, 1);
    }
    atomic_fetch_add(&job->files.bytes, bytes);
    atomic_fetch_add(&job->files.sum, sum);
    free(buffer);
    return NULL;
}

int64_t peer_read_files_locked(const char *const *paths, size_t count, int threads, const char *shard_directory,
                               int files_per_lock, uint64_t *checksum) {
    int shards[64];
    mkdir(shard_directory, 0700);
    for (int k = 0; k < 64; k++) {
        char name[4096];
        snprintf(name, sizeof name, "%s/%02x", shard_directory, k);
        shards[k] = open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (shards[k] < 0) {
            while (k-- > 0) close(shards[k]);
            return -1;
        }
    }
    struct locked_job job = { { paths, count, 0, 0, 0 }, shards, files_per_lock > 1 ? (size_t)files_per_lock : 1, 0 };
    run_pool(threads, locked_worker, &job);
    for (int k = 0; k < 64; k++) close(shards[k]);
    *checksum = atomic_load(&job.files.sum);
    return atomic_load(&job.failures) ? -1 : atomic_load(&job.files.bytes);
}

struct random_job { int fd; int64_t blocks; long count; unsigned seed; uint64_t sum; };

static void *random_worker(void *raw) {
    struct random_job *job = raw;
    unsigned char buffer[4096];
    for (long i = 0; i < job->count; i++) {
        int64_t block = (int64_t)(rand_r(&job->seed) % job->blocks);
        if (pread(job->fd, buffer, sizeof buffer, block * 4096) > 0) job->sum += buffer[7];
    }
    return NULL;
}

uint64_t peer_random_reads(int fd, int64_t size, long count, int threads, unsigned seed) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    pthread_t handles[64];
    struct random_job jobs[64];
    for (int k = 0; k < threads; k++) {
        jobs[k] = (struct random_job){ fd, size / 4096, count / threads, seed + (unsigned)k, 0 };
        pthread_create(&handles[k], NULL, random_worker, &jobs[k]);
    }
    uint64_t sum = 0;
    for (int k = 0; k < threads; k++) { pthread_join(handles[k], NULL); sum += jobs[k].sum; }
    return sum;
}

/* The C pool with a hand-off, as any API that delivers each file's bytes to one consumer
 * must do it: each file is read into its own malloc'ed buffer, workers pass finished files
 * to the consumer in groups of 16 through a bounded ring under a mutex, and the consumer
 * (the calling thread) digests and frees them. */
struct handoff_item { unsigned char *data; size_t size; };

struct handoff_job {
    const char *const *paths;
    size_t count;
    atomic_size_t next;
    pthread_mutex_t lock;
    pthread_cond_t ready, room;
    struct handoff_item ring[1024];
    size_t head, tail; /* tail - head items are queued */
    int workers_left;
    int consumer_waiting;
};

enum { handoff_group = 16 };

static void handoff_push(struct handoff_job *job, struct handoff_item *group, size_t n, int exiting) {
    pthread_mutex_lock(&job->lock);
    while (job->tail - job->head + n > sizeof job->ring / sizeof job->ring[0])
        pthread_cond_wait(&job->room, &job->lock);
    for (size_t k = 0; k < n; k++) job->ring[job->tail++ % (sizeof job->ring / sizeof job->ring[0])] = group[k];
    if (exiting) job->workers_left--;
    if (job->consumer_waiting) pthread_cond_signal(&job->ready);
    pthread_mutex_unlock(&job->lock);
}

static void *handoff_worker(void *raw) {
    struct handoff_job *job = raw;
    struct handoff_item group[handoff_group];
    size_t n = 0;
    for (;;) {
        size_t index = atomic_fetch_add(&job->next, 1);
        if (index >= job->count) break;
        unsigned char *buffer = NULL;
        size_t capacity = 0;
        long long got = read_file(job->paths[index], &buffer, &capacity);
        if (got < 0) continue;
        group[n++] = (struct handoff_item){ buffer, (size_t)got };
        if (n == handoff_group) { handoff_push(job, group, n, 0); n = 0; }
    }
    handoff_push(job, group, n, 1);
    return NULL;
}

int64_t peer_read_files_handoff(const char *const *paths, size_t count, int threads, uint64_t *checksum) {
    struct handoff_job *job = calloc(1, sizeof *job);
    job->paths = paths;
    job->count = count;
    pthread_mutex_init(&job->lock, NULL);
    pthread_cond_init(&job->ready, NULL);
    pthread_cond_init(&job->room, NULL);
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    job->workers_left = threads;
    pthread_t handles[64];
    for (int k = 0; k < threads; k++) pthread_create(&handles[k], NULL, handoff_worker, job);
    long long bytes = 0;
    unsigned long long sum = 0;
    struct handoff_item taken[sizeof job->ring / sizeof job->ring[0]];
    for (;;) {
        pthread_mutex_lock(&job->lock);
        while (job->tail == job->head && job->workers_left > 0) {
            job->consumer_waiting = 1;
            pthread_cond_wait(&job->ready, &job->lock);
            job->consumer_waiting = 0;
        }
        size_t n = 0;
        while (job->head < job->tail) taken[n++] = job->ring[job->head++ % (sizeof job->ring / sizeof job->ring[0])];
        int done = n == 0 && job->workers_left == 0;
        pthread_cond_broadcast(&job->room);
        pthread_mutex_unlock(&job->lock);
        if (done) break;
        for (size_t k = 0; k < n; k++) {
            bytes += (long long)taken[k].size;
            if (taken[k].size) sum += taken[k].data[0] + taken[k].data[taken[k].size - 1] + taken[k].size;
            free(taken[k].data);
        }
    }
    for (int k = 0; k < threads; k++) pthread_join(handles[k], NULL);
    pthread_mutex_destroy(&job->lock);
    pthread_cond_destroy(&job->ready);
    pthread_cond_destroy(&job->room);
    free(job);
    *checksum = sum;
    return bytes;
}

/* One message: a byte written into `path` and the file closed (IN_CLOSE_WRITE).
 * Async-signal-safe, for the forked child too. */
static int send_byte(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int ok = pwrite(fd, "x", 1, 0) == 1;
    close(fd);
    return ok ? 0 : -1;
}

/* Waits for any event on inotify descriptor `fd`. */
static int wait_event(int fd) {
    char events[4096] __attribute__((aligned(8)));
    return read(fd, events, sizeof events) > 0 ? 0 : -1;
}

int peer_inotify_round_trips(const char *directory, int rounds, int pause_microseconds, double *microseconds) {
    char mine[4096], theirs[4096], mineDir[4096], theirsDir[4096];
    snprintf(mineDir, sizeof mineDir, "%s/parent", directory);
    snprintf(theirsDir, sizeof theirsDir, "%s/child", directory);
    snprintf(mine, sizeof mine, "%s/message", mineDir);
    snprintf(theirs, sizeof theirs, "%s/message", theirsDir);
    mkdir(directory, 0700);
    mkdir(mineDir, 0700);
    mkdir(theirsDir, 0700);
    int parentWatch = inotify_init1(IN_CLOEXEC), childWatch = inotify_init1(IN_CLOEXEC);
    if (parentWatch < 0 || childWatch < 0
        || inotify_add_watch(parentWatch, mineDir, IN_CLOSE_WRITE) < 0
        || inotify_add_watch(childWatch, theirsDir, IN_CLOSE_WRITE) < 0) return -1;
    pid_t child = fork();
    if (child < 0) return -1;
    if (child == 0) {
        for (int round = 0; round < rounds; round++) {
            if (wait_event(childWatch) != 0 || send_byte(mine) != 0) _exit(1);
        }
        _exit(0);
    }
    int result = 0;
    for (int round = 0; round < rounds && result == 0; round++) {
        struct timespec start, end;
        if (pause_microseconds > 0) {
            struct timespec pause = { pause_microseconds / 1000000, (long)(pause_microseconds % 1000000) * 1000 };
            nanosleep(&pause, NULL);
        }
        clock_gettime(CLOCK_MONOTONIC, &start);
        if (send_byte(theirs) != 0 || wait_event(parentWatch) != 0) result = -1;
        clock_gettime(CLOCK_MONOTONIC, &end);
        microseconds[round] = (double)(end.tv_sec - start.tv_sec) * 1e6 + (double)(end.tv_nsec - start.tv_nsec) / 1e3;
    }
    if (result != 0) kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    close(parentWatch);
    close(childWatch);
    unlink(mine);
    unlink(theirs);
    rmdir(mineDir);
    rmdir(theirsDir);
    return result == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

size_t peer_heap_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
}

static double monotonic_microseconds(void) {
    struct timespec time;
    clock_gettime(CLOCK_MONOTONIC, &time);
    return (double)time.tv_sec * 1e6 + (double)time.tv_nsec / 1e3;
}

struct spawn_job {
    char *const *argv;
    int runs_each;
    atomic_int failures;
    _Atomic double longest;
};

extern char **environ;

static void *spawn_worker(void *raw) {
    struct spawn_job *job = raw;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    for (int run = 0; run < job->runs_each; run++) {
        double start = monotonic_microseconds();
        pid_t pid;
        int status = 1;
        if (posix_spawn(&pid, job->argv[0], &actions, NULL, job->argv, environ) == 0) {
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        }
        if (status != 0) atomic_fetch_add(&job->failures, 1);
        double took = monotonic_microseconds() - start;
        double longest = atomic_load(&job->longest);
        while (took > longest && !atomic_compare_exchange_weak(&job->longest, &longest, took)) {}
    }
    posix_spawn_file_actions_destroy(&actions);
    return NULL;
}

int peer_run_concurrently(char *const *argv, int workers, int runs_each, double *seconds, double *longest_microseconds) {
    struct spawn_job job = { argv, runs_each, 0, 0 };
    pthread_t *threads = calloc((size_t)workers, sizeof *threads);
    if (threads == NULL) return workers * runs_each;
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setstacksize(&attributes, 64 << 10);
    double start = monotonic_microseconds();
    int started = 0;
    for (; started < workers; started++) {
        if (pthread_create(&threads[started], &attributes, spawn_worker, &job) != 0) break;
    }
    for (int k = 0; k < started; k++) pthread_join(threads[k], NULL);
    *seconds = (monotonic_microseconds() - start) / 1e6;
    pthread_attr_destroy(&attributes);
    free(threads);
    *longest_microseconds = atomic_load(&job.longest);
    return atomic_load(&job.failures) + (workers - started) * runs_each;
}

struct flock_job { const char *path; int each; _Atomic int failures; _Atomic long longest; };

static void *flock_worker(void *argument) {
    struct flock_job *job = argument;
    for (int k = 0; k < job->each; k++) {
        double asked = monotonic_microseconds();
        int fd = open(job->path, O_RDWR);
        if (fd < 0 || flock(fd, LOCK_EX) != 0) {
            if (fd >= 0) close(fd);
            atomic_fetch_add(&job->failures, 1);
            continue;
        }
        long waited = (long)(monotonic_microseconds() - asked);
        long known = atomic_load(&job->longest);
        while (waited > known && !atomic_compare_exchange_weak(&job->longest, &known, waited)) {}
        char text[32];
        ssize_t got = pread(fd, text, sizeof text - 1, 0);
        text[got > 0 ? got : 0] = 0;
        int length = snprintf(text, sizeof text, "%ld\n", strtol(text, NULL, 10) + 1);
        // Written as a shell's `>` and the library's write in place do: truncated, then written.
        int out = open(job->path, O_WRONLY | O_TRUNC);
        if (out < 0 || write(out, text, (size_t)length) != length) atomic_fetch_add(&job->failures, 1);
        if (out >= 0) close(out);
        flock(fd, LOCK_UN);
        close(fd);
    }
    return NULL;
}

int peer_flock_threads(const char *path, int processes, int threads, int each, double *seconds, double *longest_wait_microseconds) {
    int reports[2];
    if (pipe(reports) != 0) return processes * threads * each;
    double start = monotonic_microseconds();
    int started = 0;
    for (; started < processes; started++) {
        pid_t child = fork();
        if (child < 0) break;
        if (child == 0) {
            close(reports[0]);
            struct flock_job job = { path, each, 0, 0 };
            pthread_t *workers = calloc((size_t)threads, sizeof *workers);
            int running = 0;
            for (; workers != NULL && running < threads; running++) {
                if (pthread_create(&workers[running], NULL, flock_worker, &job) != 0) break;
            }
            for (int k = 0; k < running; k++) pthread_join(workers[k], NULL);
            long report[2] = { atomic_load(&job.failures) + (threads - running) * each, atomic_load(&job.longest) };
            ssize_t written = write(reports[1], report, sizeof report);
            _exit(written == (ssize_t)sizeof report ? 0 : 1);
        }
    }
    close(reports[1]);
    long failures = (long)(processes - started) * threads * each, longest = 0, report[2];
    while (read(reports[0], report, sizeof report) == (ssize_t)sizeof report) {
        failures += report[0];
        if (report[1] > longest) longest = report[1];
    }
    close(reports[0]);
    for (int k = 0; k < started; k++) {
        int status = 0;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failures += 1;
    }
    *seconds = (monotonic_microseconds() - start) / 1e6;
    *longest_wait_microseconds = (double)longest;
    return (int)failures;
}
