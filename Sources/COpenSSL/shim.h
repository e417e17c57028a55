#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/hmac.h>
#include <openssl/core_names.h>
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
#include <malloc.h>
#include <string.h>
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

/*
 * TLS 1.3 record layer after the handshake (the hub's own, see Sources/Hub/Engine/TLSRecords.swift).
 *
 * Once a server handshake is done, the hub keeps only the traffic secrets and runs the record layer itself, so an
 * idle connection holds ~0.3 KiB of TLS state instead of OpenSSL's ~15 KiB `SSL` object. These helpers are the
 * cryptography it needs: the application traffic secrets (captured through the key-log callback, the one public
 * OpenSSL 3.0 interface that yields them), HKDF-Expand-Label (RFC 8446 §7.1), and AEAD sealing and opening with a
 * loop-wide cipher context re-keyed per record.
 */
typedef struct {
    unsigned char client[48];
    unsigned char server[48];
    int clientLength;
    int serverLength;
} hub_tls13_secrets;

static inline int hub_hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "LABEL <client random hex> <secret hex>": copies the secret when LABEL is `label`; returns its length, or 0. */
static inline int hub_keylog_take(const char *line, const char *label, unsigned char *out) {
    size_t labelLength = strlen(label);
    if (strncmp(line, label, labelLength) != 0 || line[labelLength] != ' ') return 0;
    const char *p = strchr(line + labelLength + 1, ' ');
    if (p == NULL) return 0;
    p += 1;
    int n = 0;
    while (p[0] != '\0' && p[1] != '\0' && n < 48) {
        int hi = hub_hex_value(p[0]), lo = hub_hex_value(p[1]);
        if (hi < 0 || lo < 0) return 0;
        out[n++] = (unsigned char)(hi << 4 | lo);
        p += 2;
    }
    return (n == 32 || n == 48) && (p[0] == '\0' || p[0] == '\n') ? n : 0;
}

static inline void hub_keylog(const SSL *ssl, const char *line) {
    hub_tls13_secrets *s = (hub_tls13_secrets *)SSL_get_ex_data(ssl, 0);
    if (s == NULL || line == NULL) return;
    int n;
    if ((n = hub_keylog_take(line, "CLIENT_TRAFFIC_SECRET_0", s->client)) > 0) s->clientLength = n;
    else if ((n = hub_keylog_take(line, "SERVER_TRAFFIC_SECRET_0", s->server)) > 0) s->serverLength = n;
}

static inline const unsigned char *hub_secrets_client(const hub_tls13_secrets *s) { return s->client; }
static inline const unsigned char *hub_secrets_server(const hub_tls13_secrets *s) { return s->server; }

static inline void hub_SSL_CTX_capture_tls13_secrets(SSL_CTX *ctx) { SSL_CTX_set_keylog_callback(ctx, hub_keylog); }
static inline int hub_SSL_set_secrets(SSL *ssl, hub_tls13_secrets *s) { return SSL_set_ex_data(ssl, 0, s); }

/* HKDF-Expand-Label(secret, label, "", length) for length <= the hash's (one HMAC block). */
static inline int hub_tls13_expand_label(int sha384, const unsigned char *secret, const char *label,
                                         unsigned char *out, size_t length) {
    size_t hashLength = sha384 ? 48 : 32;
    size_t labelLength = strlen(label);
    if (length > hashLength || labelLength > 200) return 0;
    unsigned char info[2 + 1 + 6 + 200 + 1 + 1];
    size_t n = 0;
    info[n++] = (unsigned char)(length >> 8);
    info[n++] = (unsigned char)(length & 0xFF);
    info[n++] = (unsigned char)(6 + labelLength);
    memcpy(info + n, "tls13 ", 6);
    n += 6;
    memcpy(info + n, label, labelLength);
    n += labelLength;
    info[n++] = 0; /* empty context */
    info[n++] = 1; /* HKDF-Expand's counter: T(1) */
    unsigned char t[EVP_MAX_MD_SIZE];
    unsigned int tl = 0;
    if (HMAC(sha384 ? EVP_sha384() : EVP_sha256(), secret, (int)hashLength, info, n, t, &tl) == NULL) return 0;
    memcpy(out, t, length);
    OPENSSL_cleanse(t, sizeof t);
    return 1;
}

/* A cipher context bound to one AEAD (0 AES-128-GCM, 1 AES-256-GCM, 2 ChaCha20-Poly1305) for one direction. */
static inline EVP_CIPHER_CTX *hub_aead_context_new(int suite, int encrypt) {
    static const char *names[3] = {"AES-128-GCM", "AES-256-GCM", "ChaCha20-Poly1305"};
    if (suite < 0 || suite > 2) return NULL;
    EVP_CIPHER *cipher = EVP_CIPHER_fetch(NULL, names[suite], NULL);
    if (cipher == NULL) return NULL;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int ok = ctx != NULL && EVP_CipherInit_ex(ctx, cipher, NULL, NULL, NULL, encrypt) == 1;
    EVP_CIPHER_free(cipher); /* the context holds its own reference */
    if (!ok) { EVP_CIPHER_CTX_free(ctx); return NULL; }
    return ctx;
}

/* Starts one record: the key, the per-record nonce, and the record header as additional data. */
static inline int hub_aead_start(EVP_CIPHER_CTX *ctx, const unsigned char *key, const unsigned char *nonce,
                                 const unsigned char *header5) {
    int outl = 0;
    if (EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, -1) != 1) return 0;
    return EVP_CipherUpdate(ctx, NULL, &outl, header5, 5) == 1;
}

static inline int hub_aead_update(EVP_CIPHER_CTX *ctx, unsigned char *out, const unsigned char *in, int length) {
    int outl = 0;
    if (length == 0) return 1;
    return EVP_CipherUpdate(ctx, out, &outl, in, length) == 1 && outl == length;
}

static inline int hub_aead_seal_finish(EVP_CIPHER_CTX *ctx, unsigned char *tag16) {
    unsigned char rest[32];
    int outl = 0;
    if (EVP_CipherFinal_ex(ctx, rest, &outl) != 1 || outl != 0) return 0;
    return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag16) == 1;
}

/* 1 when the tag authenticates the record, 0 otherwise (bad_record_mac). */
static inline int hub_aead_open_finish(EVP_CIPHER_CTX *ctx, const unsigned char *tag16) {
    unsigned char rest[32];
    int outl = 0;
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, (void *)tag16) != 1) return 0;
    return EVP_CipherFinal_ex(ctx, rest, &outl) == 1 && outl == 0;
}

/* The bytes a memory BIO holds (a ticket OpenSSL wrote after the handshake). */
static inline long hub_BIO_mem_bytes(BIO *b, char **data) { return BIO_get_mem_data(b, data); }

/* glibc's malloc_trim (Swift's Glibc module does not export malloc.h): free heap pages back to the kernel. It sits in
 * this shim because it is the package's one C header; the hub calls it after a burst of (TLS) handshakes. */
static inline int hub_malloc_trim(void) { return malloc_trim(0); }

/* HMAC-SHA256 (RFC 2104) with the key absorbed once, on OpenSSL's SHA-256 compression. `hub_hmac_sha256_key_init`
   hashes the key's inner (key XOR 0x36) and outer (key XOR 0x5c) blocks once, into two SHA256_CTX; each MAC copies
   them onto the stack, hashes the message into the inner one and the inner digest into the outer one. No allocation
   and no provider dispatch: the EVP_MAC route (a keyed EVP_MAC_CTX duplicated and freed per message) cost ~12 600
   instructions per 200-byte token under callgrind, two thirds of it duplicating and freeing contexts; one-shot
   HMAC() ~27 000. The SHA256_* functions are deprecated in OpenSSL 3 but are the ones its default provider calls
   (SHA-NI or AVX2 block functions chosen at start-up); the deprecation is silenced here only.
   A key is only read after init, so loops on several threads can share one. AuthJWTTests compares it with
   one-shot HMAC(). */
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
typedef struct { SHA256_CTX inner; SHA256_CTX outer; } hub_hmac_sha256_key;

static inline int hub_hmac_sha256_key_init(hub_hmac_sha256_key *k, const unsigned char *key, size_t keylen) {
    unsigned char block[SHA256_CBLOCK], pad[SHA256_CBLOCK];
    memset(block, 0, sizeof block);
    int ok = 1;
    if (keylen > SHA256_CBLOCK) { /* long keys are hashed first */
        SHA256_CTX c;
        ok = SHA256_Init(&c) == 1 && SHA256_Update(&c, key, keylen) == 1 && SHA256_Final(block, &c) == 1;
    }
    else if (keylen > 0) memcpy(block, key, keylen);
    for (size_t i = 0; i < sizeof pad; i++) pad[i] = block[i] ^ 0x36;
    ok = ok && SHA256_Init(&k->inner) == 1 && SHA256_Update(&k->inner, pad, sizeof pad) == 1;
    for (size_t i = 0; i < sizeof pad; i++) pad[i] = block[i] ^ 0x5c;
    ok = ok && SHA256_Init(&k->outer) == 1 && SHA256_Update(&k->outer, pad, sizeof pad) == 1;
    OPENSSL_cleanse(block, sizeof block);
    OPENSSL_cleanse(pad, sizeof pad);
    return ok;
}

/* Writes HMAC-SHA256(key, msg) to out (32 bytes); 1 on success. */
static inline int hub_hmac_sha256(const hub_hmac_sha256_key *k, const unsigned char *msg, size_t len, unsigned char *out) {
    SHA256_CTX ctx = k->inner;
    unsigned char inner[SHA256_DIGEST_LENGTH];
    int ok = SHA256_Update(&ctx, msg, len) == 1 && SHA256_Final(inner, &ctx) == 1;
    ctx = k->outer;
    ok = ok && SHA256_Update(&ctx, inner, sizeof inner) == 1 && SHA256_Final(out, &ctx) == 1;
    OPENSSL_cleanse(&ctx, sizeof ctx);
    OPENSSL_cleanse(inner, sizeof inner);
    return ok;
}

/* SHA-1 of `len` bytes into out (20 bytes), 1 on success, on a SHA_CTX on the stack: without the EVP_Digest route's
   context allocation and provider dispatch (the WebSocket accept key, once per handshake). Not SHA1(): in OpenSSL 3
   that one-shot fetches the digest by name on every call. */
static inline int hub_sha1(const unsigned char *data, size_t len, unsigned char *out) {
    SHA_CTX ctx;
    return SHA1_Init(&ctx) == 1 && SHA1_Update(&ctx, data, len) == 1 && SHA1_Final(out, &ctx) == 1;
}
#pragma clang diagnostic pop
