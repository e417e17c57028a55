/*
 * uws peer for the hub benchmarks: uWebSockets' C core called from C, with no interpreter in the path.
 *
 * The library is the one inside PyPI's socketify wheel (libsocketify_linux_amd64.so: uWebSockets v20 + uSockets on
 * libuv, with uWS's C API `uws_*`); Benchmarks/Peers/install builds this file against it with gcc and OpenSSL's
 * libcrypto. It behaves like the other peers (Peers/README.md):
 *
 *   WebSocket: ws://HOST:PORT/ws?access_token=<HS256 JWT> (or Authorization: Bearer); secret: env PEER_JWT_SECRET;
 *              account = sub; a bad token is refused at the handshake with 401.
 *   Publish:   POST http://HOST:PORT/publish (same port): one JSON object, or NDJSON (one reply line per line).
 *
 * Fan-out is uWS's own pub/sub, as in socketify/peer.py: one topic per (channel, account) and one per channel for
 * broadcasts; a publish frames the event once and hands it to uws_publish (the topic tree writes the same bytes to
 * every subscriber); `delivered` is uws_num_subscribers. One thread, one loop.
 *
 * The JSON handling is a small scanner for what the benchmark sends (top-level members of an object; strings are
 * compared and echoed as their raw bytes, escapes are not decoded). It rejects malformed structure, but it is a
 * benchmark peer, not a validator.
 */
#include <ctype.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

/* ---- uWebSockets' C API (capi/libuwebsockets.h of uWebSockets v20, as exported by the socketify library) ---- */

struct us_socket_context_options_t {
    const char *key_file_name, *cert_file_name, *passphrase, *dh_params_file_name, *ca_file_name, *ssl_ciphers;
    int ssl_prefer_low_memory_usage;
};
struct us_listen_socket_t;
typedef enum { UWS_DISABLED = 0 } uws_compress_options_t;
typedef enum { OP_CONTINUATION = 0, OP_TEXT = 1, OP_BINARY = 2, OP_CLOSE = 8, OP_PING = 9, OP_PONG = 10 } uws_opcode_t;
typedef enum { SEND_BACKPRESSURE, SEND_SUCCESS, SEND_DROPPED } uws_sendstatus_t;
typedef struct { int port; const char *host; int options; } uws_app_listen_config_t;
typedef struct uws_app_s uws_app_t;
typedef struct uws_req_s uws_req_t;
typedef struct uws_res_s uws_res_t;
typedef struct uws_socket_context_s uws_socket_context_t;
typedef struct uws_websocket_s uws_websocket_t;
typedef void (*uws_websocket_handler)(uws_websocket_t *ws, void *user_data);
typedef void (*uws_websocket_message_handler)(uws_websocket_t *ws, const char *message, size_t length,
                                              uws_opcode_t opcode, void *user_data);
typedef void (*uws_websocket_ping_pong_handler)(uws_websocket_t *ws, const char *message, size_t length, void *user_data);
typedef void (*uws_websocket_close_handler)(uws_websocket_t *ws, int code, const char *message, size_t length,
                                            void *user_data);
typedef void (*uws_websocket_upgrade_handler)(uws_res_t *response, uws_req_t *request, uws_socket_context_t *context,
                                              void *user_data);
typedef void (*uws_websocket_subscription_handler)(uws_websocket_t *ws, const char *topic, size_t topic_length,
                                                   int new_count, int old_count, void *user_data);
typedef struct {
    uws_compress_options_t compression;
    unsigned int maxPayloadLength;
    unsigned short idleTimeout;
    unsigned int maxBackpressure;
    bool closeOnBackpressureLimit;
    bool resetIdleTimeoutOnSend;
    bool sendPingsAutomatically;
    unsigned short maxLifetime;
    uws_websocket_upgrade_handler upgrade;
    uws_websocket_handler open;
    uws_websocket_message_handler message;
    uws_websocket_handler drain;
    uws_websocket_ping_pong_handler ping;
    uws_websocket_ping_pong_handler pong;
    uws_websocket_close_handler close;
    uws_websocket_subscription_handler subscription;
} uws_socket_behavior_t;
typedef void (*uws_listen_handler)(struct us_listen_socket_t *listen_socket, uws_app_listen_config_t config, void *user_data);
typedef void (*uws_method_handler)(uws_res_t *response, uws_req_t *request, void *user_data);

uws_app_t *uws_create_app(int ssl, struct us_socket_context_options_t options);
void uws_app_get(int ssl, uws_app_t *app, const char *pattern, uws_method_handler handler, void *user_data);
void uws_app_post(int ssl, uws_app_t *app, const char *pattern, uws_method_handler handler, void *user_data);
void uws_app_any(int ssl, uws_app_t *app, const char *pattern, uws_method_handler handler, void *user_data);
void uws_app_run(int ssl, uws_app_t *app);
void uws_app_listen_with_config(int ssl, uws_app_t *app, uws_app_listen_config_t config, uws_listen_handler handler,
                                void *user_data);
unsigned int uws_num_subscribers(int ssl, uws_app_t *app, const char *topic, size_t topic_length);
bool uws_publish(int ssl, uws_app_t *app, const char *topic, size_t topic_length, const char *message,
                 size_t message_length, uws_opcode_t opcode, bool compress);
void uws_res_end(int ssl, uws_res_t *res, const char *data, size_t length, bool close_connection);
void uws_res_write_status(int ssl, uws_res_t *res, const char *status, size_t length);
void uws_res_write_header(int ssl, uws_res_t *res, const char *key, size_t key_length, const char *value,
                          size_t value_length);
void uws_res_on_aborted(int ssl, uws_res_t *res, void (*handler)(uws_res_t *res, void *data), void *data);
void uws_res_on_data(int ssl, uws_res_t *res,
                     void (*handler)(uws_res_t *res, const char *chunk, size_t chunk_length, bool is_end, void *data),
                     void *data);
void uws_res_upgrade(int ssl, uws_res_t *res, void *data, const char *key, size_t key_length, const char *protocol,
                     size_t protocol_length, const char *extensions, size_t extensions_length, uws_socket_context_t *ws);
size_t uws_req_get_header(uws_req_t *req, const char *lower_case_header, size_t lower_case_header_length,
                          const char **dest);
size_t uws_req_get_query(uws_req_t *req, const char *key, size_t key_length, const char **dest);
void uws_ws(int ssl, uws_app_t *app, const char *pattern, uws_socket_behavior_t behavior, void *user_data);
void *uws_ws_get_user_data(int ssl, uws_websocket_t *ws);
uws_sendstatus_t uws_ws_send(int ssl, uws_websocket_t *ws, const char *message, size_t length, uws_opcode_t opcode);
bool uws_ws_subscribe(int ssl, uws_websocket_t *ws, const char *topic, size_t length);
bool uws_ws_unsubscribe(int ssl, uws_websocket_t *ws, const char *topic, size_t length);

/* ---- small helpers ---- */

static uws_app_t *app;
static const char *secret;
static size_t secret_len;

typedef struct { char *p; size_t len, cap; } buf_t;

static void buf_reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { perror("realloc"); abort(); }
    b->p = p;
    b->cap = cap;
}
static void buf_add(buf_t *b, const char *s, size_t n) { buf_reserve(b, n); memcpy(b->p + b->len, s, n); b->len += n; }
static void buf_str(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }
static void buf_u64(buf_t *b, unsigned long long v) { char t[24]; buf_add(b, t, (size_t)snprintf(t, sizeof t, "%llu", v)); }

/* ---- JSON scanning: raw slices of top-level members ---- */

static const char *skip_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* p at '"': returns just past the closing quote, or NULL. */
static const char *skip_string(const char *p, const char *e) {
    for (p++; p < e; p++) {
        if (*p == '\\') { p++; continue; }
        if (*p == '"') return p + 1;
        if ((unsigned char)*p < 0x20) return NULL;
    }
    return NULL;
}

static const char *skip_value(const char *p, const char *e, int depth) {
    p = skip_ws(p, e);
    if (p >= e || depth > 64) return NULL;
    if (*p == '"') return skip_string(p, e);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = skip_ws(p + 1, e);
        if (p < e && *p == close) return p + 1;
        for (;;) {
            if (close == '}') {
                if (p >= e || *p != '"' || !(p = skip_string(p, e))) return NULL;
                p = skip_ws(p, e);
                if (p >= e || *p++ != ':') return NULL;
            }
            if (!(p = skip_value(p, e, depth + 1))) return NULL;
            p = skip_ws(p, e);
            if (p >= e) return NULL;
            if (*p == close) return p + 1;
            if (*p++ != ',') return NULL;
            p = skip_ws(p, e);
        }
    }
    const char *s = p;
    while (p < e && (isalnum((unsigned char)*p) || *p == '-' || *p == '+' || *p == '.')) p++;
    return p > s ? p : NULL;
}

typedef struct { const char *p; size_t n; } slice_t;
#define MAX_MEMBERS 16
typedef struct { slice_t key[MAX_MEMBERS], val[MAX_MEMBERS]; int count; } members_t;

/* Splits a JSON object into its top-level members (raw key without quotes, raw value). false: not an object. */
static bool scan_object(const char *p, size_t len, members_t *m) {
    const char *e = p + len;
    m->count = 0;
    p = skip_ws(p, e);
    if (p >= e || *p != '{') return false;
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}') return skip_ws(p + 1, e) == e;
    for (;;) {
        if (p >= e || *p != '"') return false;
        const char *ks = p + 1, *ke = skip_string(p, e);
        if (!ke) return false;
        p = skip_ws(ke, e);
        if (p >= e || *p++ != ':') return false;
        const char *vs = skip_ws(p, e), *ve = skip_value(vs, e, 1);
        if (!ve) return false;
        if (m->count < MAX_MEMBERS) {
            m->key[m->count] = (slice_t){ks, (size_t)(ke - 1 - ks)};
            m->val[m->count] = (slice_t){vs, (size_t)(ve - vs)};
            m->count++;
        }
        p = skip_ws(ve, e);
        if (p >= e) return false;
        if (*p == '}') return skip_ws(p + 1, e) == e;
        if (*p++ != ',') return false;
        p = skip_ws(p, e);
    }
}

static const slice_t *member(const members_t *m, const char *key) {
    size_t n = strlen(key);
    for (int i = 0; i < m->count; i++)
        if (m->key[i].n == n && memcmp(m->key[i].p, key, n) == 0) return &m->val[i];
    return NULL;
}
static bool is_string(const slice_t *v) { return v && v->n >= 2 && v->p[0] == '"'; }
/* The raw bytes between the quotes. */
static slice_t inner(const slice_t *v) { return (slice_t){v->p + 1, v->n - 2}; }
static bool equals(const slice_t *v, const char *lit) { return v && v->n == strlen(lit) && memcmp(v->p, lit, v->n) == 0; }

/* ---- topics and sequence numbers ---- */

/* One topic per (channel, account) and one per channel for broadcasts (account NULL); the channel's length makes
   the name unambiguous, as in socketify/peer.py. */
static void topic(buf_t *b, slice_t channel, const slice_t *account) {
    b->len = 0;
    if (!account) { buf_str(b, "b:"); buf_add(b, channel.p, channel.n); return; }
    buf_str(b, "a");
    buf_u64(b, channel.n);
    buf_str(b, ":");
    buf_add(b, channel.p, channel.n);
    buf_str(b, ":");
    buf_add(b, account->p, account->n);
}

typedef struct { char *key; size_t n; unsigned long long seq; } seq_entry_t;
static seq_entry_t *seqs;
static size_t seq_cap, seq_count;

static uint64_t fnv(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

static unsigned long long next_seq(const char *key, size_t n) {
    if ((seq_count + 1) * 10 > seq_cap * 7) {
        size_t cap = seq_cap ? seq_cap * 2 : 1024;
        seq_entry_t *t = calloc(cap, sizeof *t);
        if (!t) { perror("calloc"); abort(); }
        for (size_t i = 0; i < seq_cap; i++) {
            if (!seqs[i].key) continue;
            size_t j = fnv(seqs[i].key, seqs[i].n) & (cap - 1);
            while (t[j].key) j = (j + 1) & (cap - 1);
            t[j] = seqs[i];
        }
        free(seqs);
        seqs = t;
        seq_cap = cap;
    }
    size_t j = fnv(key, n) & (seq_cap - 1);
    while (seqs[j].key) {
        if (seqs[j].n == n && memcmp(seqs[j].key, key, n) == 0) return ++seqs[j].seq;
        j = (j + 1) & (seq_cap - 1);
    }
    seqs[j].key = malloc(n);
    if (!seqs[j].key) { perror("malloc"); abort(); }
    memcpy(seqs[j].key, key, n);
    seqs[j].n = n;
    seqs[j].seq = 1;
    seq_count++;
    return 1;
}

/* ---- publish ---- */

static void error_reply(buf_t *out, const char *code, const char *message) {
    buf_str(out, "{\"ok\":false,\"error\":{\"code\":\"");
    buf_str(out, code);
    buf_str(out, "\",\"message\":\"");
    buf_str(out, message);
    buf_str(out, "\"}}");
}

static buf_t topic_buf, frame_buf;

/* One publish request -> one reply (no newline) appended to out; returns whether it was accepted. */
static bool publish_one(const char *line, size_t len, buf_t *out) {
    members_t m;
    if (!scan_object(line, len, &m)) { error_reply(out, "INVALID_JSON", "not a JSON object"); return false; }
    const slice_t *channel = member(&m, "channel"), *type = member(&m, "type"), *account = member(&m, "account");
    const slice_t *data = member(&m, "data");
    bool broadcast = equals(member(&m, "broadcast"), "true");
    if (account && equals(account, "null")) account = NULL;
    if (!is_string(channel) || channel->n == 2) {
        error_reply(out, "INVALID_REQUEST", "channel must be a non-empty string");
        return false;
    }
    if (!is_string(type) || type->n == 2 || type->n - 2 > 128) {
        error_reply(out, "INVALID_REQUEST", "type must be a non-empty string of at most 128 bytes");
        return false;
    }
    if (account && (!is_string(account) || account->n == 2)) {
        error_reply(out, "INVALID_REQUEST", "account must be a non-empty string");
        return false;
    }
    if ((account == NULL) == !broadcast) {
        error_reply(out, "INVALID_REQUEST", "exactly one of account or \\\"broadcast\\\":true is required");
        return false;
    }
    slice_t acct = account ? inner(account) : (slice_t){0};
    topic(&topic_buf, inner(channel), account ? &acct : NULL);
    unsigned long long seq = next_seq(topic_buf.p, topic_buf.len);
    frame_buf.len = 0;
    buf_str(&frame_buf, "{\"type\":");
    buf_add(&frame_buf, type->p, type->n);
    buf_str(&frame_buf, ",\"channel\":");
    buf_add(&frame_buf, channel->p, channel->n);
    buf_str(&frame_buf, ",\"seq\":");
    buf_u64(&frame_buf, seq);
    if (broadcast && !account) buf_str(&frame_buf, ",\"broadcast\":true");
    buf_str(&frame_buf, ",\"data\":");
    if (data) buf_add(&frame_buf, data->p, data->n); else buf_str(&frame_buf, "null");
    buf_str(&frame_buf, "}");
    unsigned int delivered = uws_num_subscribers(0, app, topic_buf.p, topic_buf.len);
    if (delivered) uws_publish(0, app, topic_buf.p, topic_buf.len, frame_buf.p, frame_buf.len, OP_TEXT, false);
    buf_str(out, "{\"ok\":true,\"seq\":");
    buf_u64(out, seq);
    buf_str(out, ",\"delivered\":");
    buf_u64(out, delivered);
    buf_str(out, "}");
    return true;
}

#define MAX_BODY (64u * 1024 * 1024)
typedef struct { buf_t body; } request_t;

static void request_free(request_t *r) { free(r->body.p); free(r); }

static void publish_aborted(uws_res_t *res, void *data) { (void)res; request_free(data); }

static void respond(uws_res_t *res, const char *status, const char *ctype, const char *body, size_t n) {
    uws_res_write_status(0, res, status, strlen(status));
    if (ctype) uws_res_write_header(0, res, "Content-Type", 12, ctype, strlen(ctype));
    uws_res_end(0, res, body, n, false);
}

static bool blank(const char *p, const char *e) { return skip_ws(p, e) == e; }

static void publish_data(uws_res_t *res, const char *chunk, size_t n, bool is_end, void *data) {
    request_t *r = data;
    if (r->body.len + n > MAX_BODY) {
        respond(res, "413 Payload Too Large", NULL, "body too large\n", 15);
        /* uWS calls neither handler again once the response ended. */
        request_free(r);
        return;
    }
    if (n) buf_add(&r->body, chunk, n);
    if (!is_end) return;
    const char *p = r->body.p ? r->body.p : "", *e = p + r->body.len;
    /* NDJSON when there are several non-blank lines and the first ends with '}'. */
    int lines = 0;
    const char *first_end = NULL;
    for (const char *s = p; s < e;) {
        const char *nl = memchr(s, '\n', (size_t)(e - s));
        const char *le = nl ? nl : e;
        if (!blank(s, le)) {
            if (lines++ == 0) first_end = le;
        }
        s = nl ? nl + 1 : e;
    }
    buf_t out = {0};
    bool ok = true;
    bool batch = false;
    if (lines > 1) {
        const char *t = first_end;
        while (t > p && (t[-1] == ' ' || t[-1] == '\t' || t[-1] == '\r')) t--;
        batch = t > p && t[-1] == '}';
    }
    if (batch) {
        for (const char *s = p; s < e;) {
            const char *nl = memchr(s, '\n', (size_t)(e - s));
            const char *le = nl ? nl : e;
            if (!blank(s, le)) {
                publish_one(s, (size_t)(le - s), &out);
                buf_str(&out, "\n");
            }
            s = nl ? nl + 1 : e;
        }
    } else {
        ok = publish_one(p, r->body.len, &out);
        buf_str(&out, "\n");
    }
    respond(res, ok ? "200 OK" : "400 Bad Request", batch ? "application/x-ndjson" : "application/json", out.p, out.len);
    free(out.p);
    request_free(r);
}

static void on_publish(uws_res_t *res, uws_req_t *req, void *user_data) {
    (void)req; (void)user_data;
    request_t *r = calloc(1, sizeof *r);
    if (!r) { perror("calloc"); abort(); }
    uws_res_on_aborted(0, res, publish_aborted, r);
    uws_res_on_data(0, res, publish_data, r);
}

static void on_healthz(uws_res_t *res, uws_req_t *req, void *user_data) {
    (void)req; (void)user_data;
    respond(res, "200 OK", NULL, "ok\n", 3);
}

static void on_other(uws_res_t *res, uws_req_t *req, void *user_data) {
    (void)req; (void)user_data;
    respond(res, "404 Not Found", NULL, "not found\n", 10);
}

/* ---- HS256 JWT ---- */

static int b64url_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
}

/* Decodes unpadded base64url into out (room for n*3/4+3 bytes); returns the length or -1. */
static long b64url_decode(const char *s, size_t n, unsigned char *out) {
    if (n % 4 == 1) return -1;
    unsigned long acc = 0;
    int bits = 0;
    long len = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64url_value(s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (unsigned long)v;
        bits += 6;
        if (bits >= 8) { bits -= 8; out[len++] = (unsigned char)(acc >> bits); }
    }
    return len;
}

static bool number_member(const members_t *m, const char *key, double *v) {
    const slice_t *s = member(m, key);
    if (!s || s->n == 0 || s->n > 40 || !(s->p[0] == '-' || isdigit((unsigned char)s->p[0]))) return false;
    char t[41];
    memcpy(t, s->p, s->n);
    t[s->n] = 0;
    char *end;
    *v = strtod(t, &end);
    return *end == 0;
}

#define MAX_TOKEN 8192

/* The account (`sub`, malloc'd, NUL-terminated) of a valid token, else NULL: HS256 only, exp and sub required,
   exp/nbf with 30 s leeway (what the other peers check with PyJWT and the hub checks). */
static char *verify(const char *tok, size_t n) {
    if (n == 0 || n > MAX_TOKEN) return NULL;
    const char *d1 = memchr(tok, '.', n);
    if (!d1) return NULL;
    const char *d2 = memchr(d1 + 1, '.', (size_t)(tok + n - d1 - 1));
    if (!d2 || memchr(d2 + 1, '.', (size_t)(tok + n - d2 - 1))) return NULL;
    unsigned char head[MAX_TOKEN], payload[MAX_TOKEN], sig[64], mac[EVP_MAX_MD_SIZE];
    long hl = b64url_decode(tok, (size_t)(d1 - tok), head);
    long pl = b64url_decode(d1 + 1, (size_t)(d2 - d1 - 1), payload);
    size_t sn = (size_t)(tok + n - d2 - 1);
    if (hl < 0 || pl < 0 || sn > 80) return NULL;
    long sl = b64url_decode(d2 + 1, sn, sig);
    members_t m;
    if (sl != 32 || !scan_object((const char *)head, (size_t)hl, &m) || !equals(member(&m, "alg"), "\"HS256\"")) return NULL;
    unsigned int ml = 0;
    if (!HMAC(EVP_sha256(), secret, (int)secret_len, (const unsigned char *)tok, (size_t)(d2 - tok), mac, &ml) ||
        ml != 32 || CRYPTO_memcmp(mac, sig, 32) != 0)
        return NULL;
    if (!scan_object((const char *)payload, (size_t)pl, &m)) return NULL;
    double now = (double)time(NULL), exp, nbf;
    if (!number_member(&m, "exp", &exp) || now > exp + 30) return NULL;
    if (member(&m, "nbf") && (!number_member(&m, "nbf", &nbf) || now + 30 < nbf)) return NULL;
    const slice_t *sub = member(&m, "sub");
    if (!is_string(sub) || sub->n == 2) return NULL;
    char *account = malloc(sub->n - 1);
    if (!account) return NULL;
    memcpy(account, sub->p + 1, sub->n - 2);
    account[sub->n - 2] = 0;
    return account;
}

/* ---- WebSocket side ---- */

static void ws_upgrade(uws_res_t *res, uws_req_t *req, uws_socket_context_t *context, void *user_data) {
    (void)user_data;
    const char *v = NULL, *key = NULL, *proto = NULL, *ext = NULL;
    size_t n = uws_req_get_header(req, "authorization", 13, &v);
    char *account = NULL;
    if (n > 7 && memcmp(v, "Bearer ", 7) == 0) {
        account = verify(v + 7, n - 7);
    } else {
        n = uws_req_get_query(req, "access_token", 12, &v);
        if (n) account = verify(v, n);
    }
    if (!account) {
        respond(res, "401 Unauthorized", NULL, "unauthorized\n", 13);
        return;
    }
    size_t kn = uws_req_get_header(req, "sec-websocket-key", 17, &key);
    size_t pn = uws_req_get_header(req, "sec-websocket-protocol", 22, &proto);
    size_t en = uws_req_get_header(req, "sec-websocket-extensions", 24, &ext);
    uws_res_upgrade(0, res, account, key, kn, proto, pn, ext, en, context);
}

static buf_t reply_buf;

static void send_reply(uws_websocket_t *ws, const char *body, const slice_t *id) {
    /* body: an object's members without the closing brace */
    reply_buf.len = 0;
    buf_str(&reply_buf, body);
    if (id) { buf_str(&reply_buf, ",\"id\":"); buf_add(&reply_buf, id->p, id->n); }
    buf_str(&reply_buf, "}");
    uws_ws_send(0, ws, reply_buf.p, reply_buf.len, OP_TEXT);
}

static void ws_message(uws_websocket_t *ws, const char *msg, size_t len, uws_opcode_t opcode, void *user_data) {
    (void)user_data;
    if (opcode != OP_TEXT) return;
    members_t m;
    const slice_t *type;
    if (!scan_object(msg, len, &m) || !is_string(type = member(&m, "type"))) {
        send_reply(ws, "{\"type\":\"error\",\"error\":{\"code\":\"VALIDATION_ERROR\",\"message\":\"expected a JSON object with a type\"}", NULL);
        return;
    }
    const slice_t *id = member(&m, "id");
    bool sub = equals(type, "\"subscribe\""), unsub = equals(type, "\"unsubscribe\"");
    if (sub || unsub) {
        const slice_t *chs = member(&m, "channels");
        if (!chs || chs->p[0] != '[') {
            send_reply(ws, "{\"type\":\"error\",\"error\":{\"code\":\"VALIDATION_ERROR\",\"message\":\"channels must be an array of strings\"}", id);
            return;
        }
        /* All elements must be strings before any is applied. */
        const char *e = chs->p + chs->n - 1;  /* at ']' */
        for (const char *p = skip_ws(chs->p + 1, e); p < e;) {
            const char *q;
            if (*p != '"' || !(q = skip_string(p, e))) {
                send_reply(ws, "{\"type\":\"error\",\"error\":{\"code\":\"VALIDATION_ERROR\",\"message\":\"channels must be an array of strings\"}", id);
                return;
            }
            p = skip_ws(q, e);
            if (p < e && *p == ',') p = skip_ws(p + 1, e);
        }
        const char *account = uws_ws_get_user_data(0, ws);
        slice_t acct = {account, strlen(account)};
        for (const char *p = skip_ws(chs->p + 1, e); p < e;) {
            const char *q = skip_string(p, e);
            slice_t ch = {p + 1, (size_t)(q - p - 2)};
            for (int b = 0; b < 2; b++) {
                topic(&topic_buf, ch, b ? NULL : &acct);
                if (sub) uws_ws_subscribe(0, ws, topic_buf.p, topic_buf.len);
                else uws_ws_unsubscribe(0, ws, topic_buf.p, topic_buf.len);
            }
            p = skip_ws(q, e);
            if (p < e && *p == ',') p = skip_ws(p + 1, e);
        }
        buf_t body = {0};
        buf_str(&body, sub ? "{\"type\":\"subscribed\",\"channels\":" : "{\"type\":\"unsubscribed\",\"channels\":");
        buf_add(&body, chs->p, chs->n);
        buf_add(&body, "", 1);
        send_reply(ws, body.p, id);
        free(body.p);
    } else if (equals(type, "\"ping\"")) {
        send_reply(ws, "{\"type\":\"pong\"", id);
    } else {
        send_reply(ws, "{\"type\":\"error\",\"error\":{\"code\":\"VALIDATION_ERROR\",\"message\":\"unknown type\"}", id);
    }
}

static void ws_close(uws_websocket_t *ws, int code, const char *message, size_t length, void *user_data) {
    (void)code; (void)message; (void)length; (void)user_data;
    free(uws_ws_get_user_data(0, ws));
}

static int port;
static const char *host = "127.0.0.1";

static void on_listen(struct us_listen_socket_t *ls, uws_app_listen_config_t config, void *user_data) {
    (void)config; (void)user_data;
    if (!ls) { fprintf(stderr, "uws peer: cannot listen on %s:%d\n", host, port); exit(1); }
    printf("uws peer: ws://%s:%d/ws  publish http://%s:%d/publish\n", host, port, host, port);
    fflush(stdout);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) port = atoi(argv[++i]);
        else if (strcmp(argv[i], "--host") == 0 && i + 1 < argc) host = argv[++i];
        else { fprintf(stderr, "usage: %s --port N [--host H]   (env PEER_JWT_SECRET)\n", argv[0]); return 2; }
    }
    secret = getenv("PEER_JWT_SECRET");
    if (!secret || !*secret) { fprintf(stderr, "PEER_JWT_SECRET is not set\n"); return 2; }
    if (port <= 0) { fprintf(stderr, "--port is required\n"); return 2; }
    secret_len = strlen(secret);
    signal(SIGPIPE, SIG_IGN);

    struct us_socket_context_options_t options = {0};
    app = uws_create_app(0, options);
    if (!app) { fprintf(stderr, "uws_create_app failed\n"); return 1; }
    uws_socket_behavior_t behavior = {0};
    behavior.compression = UWS_DISABLED;  /* the hub does not negotiate permessage-deflate on /ws either */
    behavior.maxPayloadLength = 64 * 1024;
    behavior.idleTimeout = 120;
    behavior.maxBackpressure = 1024 * 1024;  /* like the hub's 1 MiB per-connection queue, then close */
    behavior.closeOnBackpressureLimit = true;
    behavior.sendPingsAutomatically = true;
    behavior.upgrade = ws_upgrade;
    behavior.message = ws_message;
    behavior.close = ws_close;
    uws_ws(0, app, "/ws", behavior, NULL);
    uws_app_post(0, app, "/publish", on_publish, NULL);
    uws_app_get(0, app, "/healthz", on_healthz, NULL);
    uws_app_any(0, app, "/*", on_other, NULL);
    uws_app_listen_config_t config = {port, host, 0};
    uws_app_listen_with_config(0, app, config, on_listen, NULL);
    uws_app_run(0, app);
    return 0;
}
