// TLS through the system's OpenSSL, loaded on first use (see CFileCoordinationTLS.h).
// No OpenSSL header is needed to build: the few functions used are looked up by name,
// with the signatures of OpenSSL 1.1 and 3.
#include "CFileCoordinationTLS.h"
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#define FC_SSL_FILETYPE_PEM 1
#define FC_SSL_VERIFY_PEER 1
#define FC_SSL_CTRL_SET_TLSEXT_HOSTNAME 55
#define FC_TLSEXT_NAMETYPE_host_name 0
#define FC_SSL_ERROR_WANT_READ 2
#define FC_SSL_ERROR_WANT_WRITE 3
#define FC_SSL_ERROR_SYSCALL 5
#define FC_SSL_ERROR_ZERO_RETURN 6
#define FC_SSL_CTRL_SET_MIN_PROTO_VERSION 123
#define FC_TLS1_2_VERSION 0x0303

static struct {
    const void *(*client_method)(void);
    void *(*ctx_new)(const void *);
    void (*ctx_free)(void *);
    int (*load_verify)(void *, const char *, const char *);
    int (*default_paths)(void *);
    int (*use_chain)(void *, const char *);
    int (*use_key)(void *, const char *, int);
    void (*set_verify)(void *, int, void *);
    long (*ctx_ctrl)(void *, int, long, void *);
    int (*check_key)(const void *);
    void *(*ssl_new)(void *);
    void (*ssl_free)(void *);
    int (*set_fd)(void *, int);
    long (*ctrl)(void *, int, long, void *);
    int (*set1_host)(void *, const char *);
    void *(*get0_param)(void *);
    int (*param_set1_ip_asc)(void *, const char *);
    int (*do_connect)(void *);
    int (*read)(void *, void *, int);
    int (*write)(void *, const void *, int);
    int (*get_error)(const void *, int);
    long (*verify_result)(const void *);
    unsigned long (*err_get)(void);
    void (*err_clear)(void);
    void (*err_string)(unsigned long, char *, size_t);
    const char *(*verify_string)(long);
} ssl;
static pthread_once_t loaded = PTHREAD_ONCE_INIT;
static char load_error[256];

static void load(void) {
    void *library = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!library) library = dlopen("libssl.so.1.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) library = dlopen("libssl.so", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        snprintf(load_error, sizeof load_error, "TLS needs OpenSSL's libssl (Debian: libssl3): %s", dlerror());
        return;
    }
#define FIND(field, name) \
    if (!(*(void **)&ssl.field = dlsym(library, name))) { \
        snprintf(load_error, sizeof load_error, "OpenSSL lacks %s", name); \
        ssl.client_method = NULL; \
        return; \
    }
    FIND(ctx_new, "SSL_CTX_new")
    FIND(ctx_free, "SSL_CTX_free")
    FIND(load_verify, "SSL_CTX_load_verify_locations")
    FIND(default_paths, "SSL_CTX_set_default_verify_paths")
    FIND(use_chain, "SSL_CTX_use_certificate_chain_file")
    FIND(use_key, "SSL_CTX_use_PrivateKey_file")
    FIND(set_verify, "SSL_CTX_set_verify")
    FIND(ctx_ctrl, "SSL_CTX_ctrl")
    FIND(check_key, "SSL_CTX_check_private_key")
    FIND(ssl_new, "SSL_new")
    FIND(ssl_free, "SSL_free")
    FIND(set_fd, "SSL_set_fd")
    FIND(ctrl, "SSL_ctrl")
    FIND(set1_host, "SSL_set1_host")
    FIND(get0_param, "SSL_get0_param")
    FIND(param_set1_ip_asc, "X509_VERIFY_PARAM_set1_ip_asc")
    FIND(do_connect, "SSL_connect")
    FIND(read, "SSL_read")
    FIND(write, "SSL_write")
    FIND(get_error, "SSL_get_error")
    FIND(verify_result, "SSL_get_verify_result")
    FIND(err_get, "ERR_get_error")
    FIND(err_string, "ERR_error_string_n")
    FIND(err_clear, "ERR_clear_error")
    FIND(verify_string, "X509_verify_cert_error_string")
    FIND(client_method, "TLS_client_method")
#undef FIND
}

static void consume_sigpipe(const sigset_t *pipe_signal);

/// OpenSSL's last error (or `fallback`) into `error`.
static void describe(const char *what, const char *fallback, char *error, size_t size) {
    unsigned long code = ssl.err_get ? ssl.err_get() : 0;
    char reason[200] = {0};
    if (code) ssl.err_string(code, reason, sizeof reason);
    snprintf(error, size, "%s: %s", what, code ? reason : fallback);
    while (ssl.err_get && ssl.err_get()) {}
}

void *fc_tls_context(const char *ca_file, const char *cert_file, const char *key_file, char *error, size_t size) {
    pthread_once(&loaded, load);
    if (!ssl.client_method) {
        snprintf(error, size, "%s", load_error);
        return NULL;
    }
    void *context = ssl.ctx_new(ssl.client_method());
    if (!context) {
        describe("TLS context", "cannot be made", error, size);
        return NULL;
    }
    ssl.set_verify(context, FC_SSL_VERIFY_PEER, NULL);
    // TLS 1.2 at least, whatever the system's OpenSSL configuration allows.
    if (ssl.ctx_ctrl(context, FC_SSL_CTRL_SET_MIN_PROTO_VERSION, FC_TLS1_2_VERSION, NULL) != 1) {
        describe("TLS context", "cannot require TLS 1.2", error, size);
        ssl.ctx_free(context);
        return NULL;
    }
    if (ca_file ? ssl.load_verify(context, ca_file, NULL) != 1 : ssl.default_paths(context) != 1) {
        describe(ca_file ? ca_file : "the system's CA certificates", "cannot be loaded", error, size);
        ssl.ctx_free(context);
        return NULL;
    }
    if ((cert_file == NULL) != (key_file == NULL)) {
        snprintf(error, size, "%s: a client certificate and its key go together; %s",
                 cert_file ? cert_file : key_file, cert_file ? "no key was given" : "no certificate was given");
        ssl.ctx_free(context);
        return NULL;
    }
    if (cert_file && ssl.use_chain(context, cert_file) != 1) {
        describe(cert_file, "not a certificate", error, size);
        ssl.ctx_free(context);
        return NULL;
    }
    if (key_file && ssl.use_key(context, key_file, FC_SSL_FILETYPE_PEM) != 1) {
        char what[512];
        snprintf(what, sizeof what, "%s: not a private key that matches the certificate %s", key_file, cert_file);
        describe(what, "unreadable", error, size);
        ssl.ctx_free(context);
        return NULL;
    }
    // A key of another type than the certificate's is taken without a word: checked here,
    // rather than found out in a handshake that fails.
    if (key_file && ssl.check_key(context) != 1) {
        while (ssl.err_get()) {}
        snprintf(error, size, "%s: the private key does not match the certificate %s", key_file, cert_file);
        ssl.ctx_free(context);
        return NULL;
    }
    return context;
}

void *fc_tls_session(void *context, int fd, const char *host, char *error, size_t size) {
    void *session = ssl.ssl_new(context);
    if (!session) {
        describe("TLS session", "cannot be made", error, size);
        return NULL;
    }
    ssl.err_clear();
    if (ssl.set_fd(session, fd) != 1) {
        describe("TLS session", "cannot use the socket", error, size);
        ssl.ssl_free(session);
        return NULL;
    }
    // An IP address is checked against the certificate's IP entries; a name against its
    // DNS names, and sent as SNI (which carries names only). A check that cannot be set
    // up fails the session: a session without it would take any certificate the CA signed.
    if (ssl.param_set1_ip_asc(ssl.get0_param(session), host) != 1) {
        ssl.err_clear();
        if (ssl.ctrl(session, FC_SSL_CTRL_SET_TLSEXT_HOSTNAME, FC_TLSEXT_NAMETYPE_host_name, (void *)host) != 1) {
            describe(host, "cannot be sent as the TLS server name (SNI)", error, size);
            ssl.ssl_free(session);
            return NULL;
        }
        if (ssl.set1_host(session, host) != 1) {
            describe(host, "cannot be checked against the server's certificate", error, size);
            ssl.ssl_free(session);
            return NULL;
        }
    }
    ssl.err_clear();
    return session;
}

int fc_tls_handshake(void *session, char *error, size_t size) {
    sigset_t pipe_signal, previous;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, &previous);
    errno = 0;
    ssl.err_clear();
    int connected = ssl.do_connect(session);
    int reason = connected == 1 ? 0 : ssl.get_error(session, connected);
    int saved = errno;
    consume_sigpipe(&pipe_signal);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (connected == 1) return 1;
    if (reason == FC_SSL_ERROR_WANT_READ) return FC_TLS_WANT_READ;
    if (reason == FC_SSL_ERROR_WANT_WRITE) return FC_TLS_WANT_WRITE;
    long verified = ssl.verify_result(session);
    if (verified != 0) {
        snprintf(error, size, "TLS handshake: the server's certificate: %s", ssl.verify_string(verified));
        return FC_TLS_REFUSED;
    }
    describe("TLS handshake", saved ? strerror(saved) : "refused", error, size);
    return -1;
}

/// A SIGPIPE the call raised on this thread (blocked meanwhile), whatever the call ended
/// with: an alert OpenSSL sends on a failed read writes too.
static void consume_sigpipe(const sigset_t *pipe_signal) {
    sigset_t pending;
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        struct timespec none = {0, 0};
        sigtimedwait(pipe_signal, NULL, &none);
    }
}

static long finish(void *session, int result) {
    if (result > 0) return result;
    switch (ssl.get_error(session, result)) {
    case FC_SSL_ERROR_ZERO_RETURN: return 0;
    case FC_SSL_ERROR_WANT_READ: return FC_TLS_WANT_READ;
    case FC_SSL_ERROR_WANT_WRITE: return FC_TLS_WANT_WRITE;
    case FC_SSL_ERROR_SYSCALL: if (errno == 0) return 0; return -1;
    default: errno = EPROTO; return -1;
    }
}

// OpenSSL writes to the socket with write(2), which raises SIGPIPE when the peer has
// closed it (a member that went away): blocked on this thread for the call, and a SIGPIPE
// it raised consumed, so that the process is not killed and the call fails with EPIPE.
static long without_sigpipe(void *session, void *buffer, size_t count, int writing) {
    sigset_t pipe_signal, previous;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, &previous);
    errno = 0;
    ssl.err_clear();
    int size = count > 1 << 30 ? 1 << 30 : (int)count;
    long result = finish(session, writing ? ssl.write(session, buffer, size) : ssl.read(session, buffer, size));
    int saved = errno;
    consume_sigpipe(&pipe_signal);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    errno = saved;
    return result;
}

long fc_tls_read(void *session, void *buffer, size_t count) {
    return without_sigpipe(session, buffer, count, 0);
}

long fc_tls_write(void *session, const void *buffer, size_t count) {
    return without_sigpipe(session, (void *)buffer, count, 1);
}

void fc_tls_free(void *session) { if (session) ssl.ssl_free(session); }
void fc_tls_free_context(void *context) { if (context) ssl.ctx_free(context); }
