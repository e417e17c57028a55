#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/bn.h>
#include <openssl/ecdsa.h>
#include <openssl/rsa.h>
#include <openssl/crypto.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

/* Function-like macros of OpenSSL that Swift cannot import, as functions. */
static inline long hub_SSL_CTX_set_mode(SSL_CTX *ctx, long mode) { return SSL_CTX_set_mode(ctx, mode); }
static inline int hub_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int v) { return (int)SSL_CTX_set_min_proto_version(ctx, v); }
static inline int hub_SSL_CTX_set_max_proto_version(SSL_CTX *ctx, int v) { return (int)SSL_CTX_set_max_proto_version(ctx, v); }
static inline long hub_SSL_CTX_set_session_cache_mode(SSL_CTX *ctx, long m) { return SSL_CTX_set_session_cache_mode(ctx, m); }
static inline void hub_SSL_CTX_set_read_ahead(SSL_CTX *ctx, int yes) { SSL_CTX_set_read_ahead(ctx, yes); }
static inline uint64_t hub_SSL_OP_defaults(void) {
    return SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_IGNORE_UNEXPECTED_EOF;
}
static inline int hub_SSL_set_tlsext_host_name(SSL *ssl, const char *name) { return (int)SSL_set_tlsext_host_name(ssl, name); }

/*
 * A socket BIO that sends with MSG_NOSIGNAL (a write to a reset peer is EPIPE, never SIGPIPE, whatever the
 * process's signal disposition), and counts nothing else. The descriptor is the BIO's data (as an intptr_t);
 * the connection owns and closes it.
 */
static inline int hub_bio_write(BIO *b, const char *data, size_t len, size_t *written) {
    int fd = (int)(intptr_t)BIO_get_data(b);
    BIO_clear_flags(b, BIO_FLAGS_RWS | BIO_FLAGS_SHOULD_RETRY);
    ssize_t n;
    do { n = send(fd, data, len, MSG_NOSIGNAL); } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_flags(b, BIO_FLAGS_WRITE | BIO_FLAGS_SHOULD_RETRY);
        *written = 0;
        return 0;
    }
    *written = (size_t)n;
    return 1;
}

static inline int hub_bio_read(BIO *b, char *data, size_t len, size_t *readbytes) {
    int fd = (int)(intptr_t)BIO_get_data(b);
    BIO_clear_flags(b, BIO_FLAGS_RWS | BIO_FLAGS_SHOULD_RETRY);
    ssize_t n;
    do { n = read(fd, data, len); } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_flags(b, BIO_FLAGS_READ | BIO_FLAGS_SHOULD_RETRY);
        *readbytes = 0;
        return 0;
    }
    if (n == 0) { *readbytes = 0; return 0; } /* EOF: no retry flag */
    *readbytes = (size_t)n;
    return 1;
}

static inline long hub_bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)b; (void)num; (void)ptr;
    switch (cmd) {
    case BIO_CTRL_FLUSH: return 1;
    default: return 0;
    }
}

static inline int hub_bio_create(BIO *b) { BIO_set_init(b, 1); return 1; }
static inline int hub_bio_destroy(BIO *b) { (void)b; return 1; }

/* The method, made once by the caller (Swift keeps it for the life of the process). */
static inline BIO_METHOD *hub_bio_method_new(void) {
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "hub socket");
    if (m == NULL) return NULL;
    BIO_meth_set_write_ex(m, hub_bio_write);
    BIO_meth_set_read_ex(m, hub_bio_read);
    BIO_meth_set_ctrl(m, hub_bio_ctrl);
    BIO_meth_set_create(m, hub_bio_create);
    BIO_meth_set_destroy(m, hub_bio_destroy);
    return m;
}

static inline BIO *hub_bio_new(BIO_METHOD *m, int fd) {
    BIO *b = BIO_new(m);
    if (b != NULL) BIO_set_data(b, (void *)(intptr_t)fd);
    return b;
}

/* ALPN: the server speaks http/1.1 only (RFC 7301: a client offering only other protocols is refused). */
static inline int hub_alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                                  const unsigned char *in, unsigned int inlen, void *arg) {
    (void)ssl; (void)arg;
    static const unsigned char wire[] = "\x08http/1.1";
    unsigned char *selected = NULL;
    unsigned char selectedLength = 0;
    if (SSL_select_next_proto(&selected, &selectedLength, wire, sizeof(wire) - 1, in, inlen) == OPENSSL_NPN_NEGOTIATED) {
        *out = selected;
        *outlen = selectedLength;
        return SSL_TLSEXT_ERR_OK;
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

static inline void hub_SSL_CTX_use_alpn_http11(SSL_CTX *ctx) { SSL_CTX_set_alpn_select_cb(ctx, hub_alpn_select, NULL); }
