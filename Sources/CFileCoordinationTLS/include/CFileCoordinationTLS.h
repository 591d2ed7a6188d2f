// TLS for the etcd space (FileCoordinationEtcd); the local library does not link it.
#ifndef FILECOORDINATION_TLS_H
#define FILECOORDINATION_TLS_H

#include <stddef.h>

/// TLS for the etcd space, through the system's OpenSSL (libssl.so.3), loaded with
/// dlopen the first time a TLS connection is made: a process that never asks for TLS
/// (every local space, every `exec`) loads none of it at start-up. On failure each call
/// returns NULL or -1 and writes one line of explanation into `error`.
///
/// A context: the CA bundle to trust (NULL: the system's), and a client certificate and
/// key (both NULL: none; one without the other, or a key that does not match the
/// certificate, is an error). TLS 1.2 at least.
void *fc_tls_context(const char *ca_file, const char *cert_file, const char *key_file, char *error, size_t size);
/// Returned by the calls below when they wait for the socket (it is non-blocking): poll
/// it for reading, or for writing, then call again with the same arguments.
#define FC_TLS_WANT_READ (-2)
#define FC_TLS_WANT_WRITE (-3)
/// Returned by ``fc_tls_handshake`` when the server's certificate is refused (not signed
/// by a CA trusted, expired, or for another name or address).
#define FC_TLS_REFUSED (-4)
/// A TLS session over the connected, non-blocking socket `fd`, its peer to be verified
/// against `host` (a name or an IP address; a name is also sent as SNI); NULL when either
/// cannot be set up. The handshake is made by ``fc_tls_handshake``.
void *fc_tls_session(void *context, int fd, const char *host, char *error, size_t size);
/// Advances the handshake: 1 once done, FC_TLS_WANT_READ or FC_TLS_WANT_WRITE while it
/// waits for the socket, FC_TLS_REFUSED when the server's certificate is refused, -1 on
/// another failure.
int fc_tls_handshake(void *session, char *error, size_t size);
/// As read(2) and write(2) on the non-blocking socket: bytes moved, 0 at the end,
/// FC_TLS_WANT_READ or FC_TLS_WANT_WRITE while waiting, -1 on failure (errno set).
long fc_tls_read(void *session, void *buffer, size_t count);
long fc_tls_write(void *session, const void *buffer, size_t count);
/// Frees a session (the socket stays open) or a context.
void fc_tls_free(void *session);
void fc_tls_free_context(void *context);

#endif
