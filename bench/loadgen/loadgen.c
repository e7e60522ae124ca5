/* loadgen: a NATS load generator that speaks the NATS text protocol itself.
 *
 * Theory of operation
 * - request mode: each of --conns threads opens one TCP connection to nats-server, sends
 *   CONNECT (headers on, no_responders on) and PING, waits for PONG, subscribes to
 *   "<inbox>.*" and keeps --inflight plain requests outstanding: "PUB <subject>
 *   <inbox>.<slot> <size>". Each reply frees its slot, records the latency from that slot's
 *   send time in a log-linear histogram (HDR-style: 2^7 sub-buckets per power of two, so a
 *   recorded value is within 0.8 % of the true one) and sends the next request on the same
 *   slot. Writes are batched: every request made while parsing one read goes out in one
 *   write. A reply whose body contains "error" counts as an error; a no-responders status
 *   (HMSG "503") as no_responders; both still free the slot.
 * - Fixed count (--count, split over the connections) or fixed duration (--duration, with
 *   --warmup seconds first whose acks are not counted); --rate paces requests (an open loop,
 *   still never more than --inflight outstanding per connection). --stamp writes the send
 *   time (CLOCK_MONOTONIC ns, 20 decimal digits) at the start of each payload: the clock
 *   Python's time.monotonic_ns() reads, so another process can time delivery. --start-at
 *   (CLOCK_MONOTONIC ns) lets several processes start sending together.
 * - --messages FILE replaces the fixed subject and payload with a list of messages, sent in
 *   turn: request k of connection i of C is message (--first-message + i + k*C) modulo the
 *   list's length, so a counted run over one process sends each message of the list once.
 *   The file is a run of records: u16 subject length, subject, u32 header length, the NATS
 *   header block (empty: a plain PUB, else HPUB), u32 payload length, payload (lengths
 *   big-endian; bench/loadgen/__init__.py writes it).
 * - respond mode: --conns connections subscribe to --subject in queue group "loadgen" and
 *   answer every message that has a reply subject with "+OK", storing nothing: the no-op
 *   peer whose rate is the generator's own ceiling. It prints "ready" once subscribed and
 *   runs until killed (or --duration).
 * - TLS (--tls-ca, with --tls-cert and --tls-key for a client certificate): after the
 *   server's INFO, which NATS sends in clear, the connection carries on over TLS (OpenSSL,
 *   the server's certificate checked against the CA and the host); every read and write
 *   after that goes through it. Built in only when OpenSSL's headers are there (`make
 *   loadgen` looks for them); a binary without it refuses --tls-ca and says what to install.
 * - --protocol frames: the same requests to a Jetstream broker's socket API instead of NATS
 *   (length-prefixed frames: u32 length, u32 correlation id, u8 kind, u8 op, u32 header
 *   length, msgpack header, payload; jetstream/protocol/frames.py). --messages is then a
 *   list of whole request frames, encoded by the bench: the first is the HELLO each
 *   connection opens with, the rest are the requests, each sent with its slot + 1 as its
 *   correlation id, which the response echoes. An error frame (kind 3) counts as an error.
 *   In respond mode it listens on 127.0.0.1 (--url's port, 0: any), prints "ready PORT" and
 *   answers every request frame with an empty response frame: the no-op peer.
 * - Output (request mode): one JSON object on stdout with counts, the run's CLOCK_MONOTONIC
 *   start and end, this process's CPU seconds and the histogram as sparse [index, count]
 *   pairs (values in ns), which bench/loadgen/histogram.py reads and merges.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#ifdef LOADGEN_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

#define SUB_BUCKET_BITS 7
#define SUB_BUCKETS (1 << SUB_BUCKET_BITS)
#define BUCKETS ((64 - SUB_BUCKET_BITS + 1) * SUB_BUCKETS)
#define READ_CHUNK (1 << 20)
#define LINE_MAX_BYTES 4096
#define PAYLOAD_MAX (64 << 20)
#define INFLIGHT_MAX (1 << 20)
#define STAMP_DIGITS 20

typedef struct {
    const char *host;
    const char *port;
    const char *mode;
    const char *subject;
    long size;
    long inflight;
    long conns;
    long long count;
    double duration_s;
    double warmup_s;
    double rate;
    int stamp;
    double timeout_s;
    long long start_at_ns;
    const char *messages;
    long long first_message;
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
    int frames;  /* --protocol frames: the Jetstream socket API */
} options_t;

typedef struct {
    const char *subject;
    const char *headers;
    const char *payload;
    uint32_t subject_len, header_len, payload_len;
} message_t;

typedef struct {
    int fd;
    void *ssl;  /* the connection's SSL once upgraded to TLS, else NULL */
    char *in;
    size_t in_len, in_cap;
    char *out;
    size_t out_len, out_cap;
    int pongs;
} conn_t;

typedef struct {
    int index;
    long long quota;      /* fixed count: requests this connection sends; -1 for duration */
    uint64_t counts[BUCKETS];
    long long sent, acked, counted, errors, no_responders;
    int timed_out;
    char failure[256];
} worker_t;

static options_t opt;
static char payload_template[64];
static message_t *messages;
static long long message_count;
static int64_t run_start_ns, measure_from_ns, deadline_ns;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static int bucket_of(uint64_t v) {
    if (v < SUB_BUCKETS) return (int)v;
    int e = 63 - __builtin_clzll(v);
    uint64_t m = v >> (e - SUB_BUCKET_BITS);
    return (e - SUB_BUCKET_BITS + 1) * SUB_BUCKETS + (int)(m - SUB_BUCKETS);
}

static uint32_t be32(const char *at) {
    const unsigned char *u = (const unsigned char *)at;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

/* -- buffers and the socket ------------------------------------------------------------- */

static void reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t cap2 = *cap ? *cap : 4096;
    while (cap2 < need) cap2 *= 2;
    *buf = realloc(*buf, cap2);
    if (!*buf) die("out of memory");
    *cap = cap2;
}

static void out_append(conn_t *c, const char *data, size_t len) {
    reserve(&c->out, &c->out_cap, c->out_len + len);
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
}

static void out_printf(conn_t *c, const char *fmt, ...) {
    va_list ap;
    reserve(&c->out, &c->out_cap, c->out_len + LINE_MAX_BYTES);
    va_start(ap, fmt);
    int n = vsnprintf(c->out + c->out_len, LINE_MAX_BYTES, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= LINE_MAX_BYTES) die("protocol line too long");
    c->out_len += (size_t)n;
}

/* -- TLS -------------------------------------------------------------------------------- */

#ifdef LOADGEN_TLS
static SSL_CTX *tls_ctx;

static void die_tls(const char *what) {
    char reason[256] = "";
    unsigned long e = ERR_get_error();
    if (e) ERR_error_string_n(e, reason, sizeof reason);
    die("%s: %s", what, reason[0] ? reason : "(no OpenSSL error)");
}

static void tls_setup(void) {
    tls_ctx = SSL_CTX_new(TLS_client_method());
    if (!tls_ctx) die_tls("cannot make a TLS context");
    SSL_CTX_set_verify(tls_ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_load_verify_locations(tls_ctx, opt.tls_ca, NULL) != 1)
        die_tls("cannot load --tls-ca");
    if (opt.tls_cert) {
        if (SSL_CTX_use_certificate_chain_file(tls_ctx, opt.tls_cert) != 1)
            die_tls("cannot load --tls-cert");
        if (SSL_CTX_use_PrivateKey_file(tls_ctx, opt.tls_key, SSL_FILETYPE_PEM) != 1)
            die_tls("cannot load --tls-key");
        if (SSL_CTX_check_private_key(tls_ctx) != 1)
            die_tls("--tls-key does not match --tls-cert");
    }
}

/* Carries on over TLS on c's socket, checking the server's certificate for opt.host. */
static void tls_upgrade(conn_t *c) {
    SSL *ssl = SSL_new(tls_ctx);
    if (!ssl) die_tls("cannot make a TLS connection");
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, opt.host) != 1) {  /* not an IP: a host name */
        SSL_set_tlsext_host_name(ssl, opt.host);
        if (SSL_set1_host(ssl, opt.host) != 1) die_tls("bad host name");
    }
    if (SSL_set_fd(ssl, c->fd) != 1) die_tls("cannot attach TLS to the socket");
    if (SSL_connect(ssl) != 1) die_tls("TLS handshake failed");
    c->ssl = ssl;
}

static int tls_read(conn_t *c, char *into, size_t room) {
    int n = SSL_read(c->ssl, into, room > INT32_MAX ? INT32_MAX : (int)room);
    if (n > 0) return n;
    int e = SSL_get_error(c->ssl, n);
    if (e == SSL_ERROR_WANT_READ) return 0;  /* a record without application data */
    if (e == SSL_ERROR_SYSCALL && errno == EINTR) return 0;
    return -1;
}

static int tls_write(conn_t *c, const char *data, size_t len) {
    int n = SSL_write(c->ssl, data, len > INT32_MAX ? INT32_MAX : (int)len);
    if (n > 0) return n;
    int e = SSL_get_error(c->ssl, n);
    if (e == SSL_ERROR_SYSCALL && errno == EINTR) return 0;
    return -1;
}

static int tls_pending(conn_t *c) { return c->ssl && SSL_pending(c->ssl) > 0; }

static void tls_close(conn_t *c) {
    if (c->ssl) SSL_free(c->ssl);
    c->ssl = NULL;
}
#else
static void tls_setup(void) {
    die("this loadgen was built without TLS: install OpenSSL's headers (Debian/Ubuntu: apt "
        "install libssl-dev), then run `make -B loadgen`");
}
static void tls_upgrade(conn_t *c) { (void)c; }
static int tls_read(conn_t *c, char *into, size_t room) { (void)c; (void)into; (void)room; return -1; }
static int tls_write(conn_t *c, const char *data, size_t len) { (void)c; (void)data; (void)len; return -1; }
static int tls_pending(conn_t *c) { (void)c; return 0; }
static void tls_close(conn_t *c) { (void)c; }
#endif

static void conn_close(conn_t *c) {
    tls_close(c);
    close(c->fd);
}

static int flush_out(conn_t *c) {
    size_t off = 0;
    while (off < c->out_len) {
        ssize_t n = c->ssl ? tls_write(c, c->out + off, c->out_len - off)
                           : write(c->fd, c->out + off, c->out_len - off);
        if (n < 0) {
            if (errno == EINTR && !c->ssl) continue;
            return -1;
        }
        off += (size_t)n;
    }
    c->out_len = 0;
    return 0;
}

static int dial(void) {
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(opt.host, opt.port, &hints, &res);
    if (rc != 0) die("cannot resolve %s:%s: %s", opt.host, opt.port, gai_strerror(rc));
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) die("cannot connect to %s:%s: %s", opt.host, opt.port, strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Reads what is there (waiting at most until `until_ns`; 0: wait without limit). 1 when bytes
 * came, 0 on time-out, -1 when the connection closed or failed. */
static int read_some(conn_t *c, int64_t until_ns) {
    for (;;) {
        if (until_ns && !tls_pending(c)) {
            int64_t left = until_ns - now_ns();
            if (left <= 0) return 0;
            struct pollfd p = {.fd = c->fd, .events = POLLIN};
            struct timespec ts = {.tv_sec = left / 1000000000LL,
                                  .tv_nsec = left % 1000000000LL};
            int rc = ppoll(&p, 1, &ts, NULL);
            if (rc == 0) return 0;
            if (rc < 0) return errno == EINTR ? 0 : -1;
        }
        reserve(&c->in, &c->in_cap, c->in_len + READ_CHUNK);
        char *into = c->in + c->in_len;
        size_t room = c->in_cap - c->in_len;
        if (c->ssl) {
            int n = tls_read(c, into, room);
            if (n < 0) return -1;
            if (n == 0) continue;  /* TLS bookkeeping only: wait for data again */
            c->in_len += (size_t)n;
            return 1;
        }
        ssize_t n = read(c->fd, into, room);
        if (n < 0 && errno == EINTR) return 0;
        if (n <= 0) return -1;
        c->in_len += (size_t)n;
        return 1;
    }
}

/* -- the protocol ----------------------------------------------------------------------- */

typedef struct {
    const char *subject;
    size_t subject_len;
    const char *reply;
    size_t reply_len;
    const char *body;   /* headers (HMSG) then payload */
    size_t header_len;
    size_t total_len;
} msg_t;

typedef void (*on_msg_fn)(void *ctx, conn_t *c, const msg_t *m);

/* Splits a MSG/HMSG control line into its space-separated fields; their count. */
static int split_fields(char *line, char **fields, int max) {
    int n = 0;
    char *p = line;
    while (*p && n < max) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        fields[n++] = p;
        while (*p && *p != ' ' && *p != '\t') p++;
        if (*p) *p++ = '\0';
    }
    return n;
}

/* Handles every complete protocol message in c->in; keeps an incomplete tail. */
static void parse(conn_t *c, on_msg_fn on_msg, void *ctx) {
    size_t pos = 0;
    while (pos < c->in_len) {
        char *start = c->in + pos;
        char *eol = memmem(start, c->in_len - pos, "\r\n", 2);
        if (!eol) break;
        size_t line_len = (size_t)(eol - start);
        if (line_len >= 4 && (memcmp(start, "MSG ", 4) == 0 || memcmp(start, "HMSG", 4) == 0)) {
            int with_headers = start[0] == 'H';
            char line[LINE_MAX_BYTES];
            if (line_len >= sizeof line) die("control line too long");
            memcpy(line, start, line_len);
            line[line_len] = '\0';
            char *f[6];
            int n = split_fields(line, f, 6);
            /* MSG subj sid [reply] len | HMSG subj sid [reply] hlen tlen */
            int base = with_headers ? 5 : 4;
            if (n != base && n != base + 1) die("bad control line: %s", line);
            int has_reply = n == base + 1;
            size_t total = strtoull(f[n - 1], NULL, 10);
            size_t header = with_headers ? strtoull(f[n - 2], NULL, 10) : 0;
            size_t need = line_len + 2 + total + 2;
            if (c->in_len - pos < need) break;
            msg_t m = {0};
            /* point into the buffer, not the copy: offsets of the fields in the line */
            m.subject = start + (f[1] - line);
            m.subject_len = strlen(f[1]);
            if (has_reply) {
                m.reply = start + (f[3] - line);
                m.reply_len = strlen(f[3]);
            }
            m.body = eol + 2;
            m.header_len = header;
            m.total_len = total;
            on_msg(ctx, c, &m);
            pos += need;
        } else if (line_len == 4 && memcmp(start, "PING", 4) == 0) {
            out_append(c, "PONG\r\n", 6);
            pos += line_len + 2;
        } else if (line_len == 4 && memcmp(start, "PONG", 4) == 0) {
            c->pongs++;
            pos += line_len + 2;
        } else if (line_len >= 4 && memcmp(start, "-ERR", 4) == 0) {
            die("server error: %.*s", (int)line_len, start);
        } else {  /* INFO, +OK */
            pos += line_len + 2;
        }
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
}

static void ignore_msg(void *ctx, conn_t *c, const msg_t *m) { (void)ctx; (void)c; (void)m; }

/* With TLS: the server's INFO (in clear), then the TLS handshake. Then CONNECT, then PING
 * until PONG: the server has taken what was sent before. */
static void handshake(conn_t *c, const char *subscribe) {
    if (opt.tls_ca) {
        int64_t info_until = now_ns() + (int64_t)(opt.timeout_s * 1e9);
        while (!memmem(c->in, c->in_len, "\r\n", 2)) {
            int rc = read_some(c, info_until);
            if (rc < 0) die("connection closed before the server's INFO");
            if (rc == 0) die("no INFO within %.0f s", opt.timeout_s);
        }
        char *eol = memmem(c->in, c->in_len, "\r\n", 2);
        size_t info_len = (size_t)(eol - c->in) + 2;
        if (c->in_len != info_len) die("the server spoke in clear after its INFO");
        c->in_len = 0;
        tls_upgrade(c);
    }
    out_printf(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,"
                  "\"no_responders\":true,\"name\":\"loadgen\",\"lang\":\"c\","
                  "\"version\":\"1\",\"protocol\":1}\r\n");
    if (subscribe) out_printf(c, "%s", subscribe);
    out_printf(c, "PING\r\n");
    if (flush_out(c) < 0) die("write failed during the handshake");
    int64_t until = now_ns() + (int64_t)(opt.timeout_s * 1e9);
    while (c->pongs == 0) {
        int rc = read_some(c, until);
        if (rc < 0) die("connection closed during the handshake");
        if (rc == 0) die("no PONG within %.0f s", opt.timeout_s);
        parse(c, ignore_msg, NULL);
    }
    flush_out(c);
}

/* -- request mode ----------------------------------------------------------------------- */

typedef struct {
    worker_t *w;
    int64_t *sent_ns;
    long *free_slots;  /* paced mode: a stack of the slots without a request outstanding */
    long free_count;
    char inbox[64];
    long outstanding;
    long long next_seq;  /* requests made */
} requester_t;

/* Request `seq` of this connection from the --messages list. */
static void send_listed(requester_t *r, conn_t *c, long slot) {
    if (opt.frames) {  /* messages[0] is the HELLO: the requests are the rest */
        long long index = 1 + (opt.first_message + r->w->index + r->next_seq * opt.conns)
                              % (message_count - 1);
        const message_t *m = &messages[index];
        size_t at = c->out_len;
        out_append(c, m->payload, m->payload_len);
        uint32_t id = htonl((uint32_t)slot + 1);
        memcpy(c->out + at + 4, &id, 4);
        return;
    }
    long long index = (opt.first_message + r->w->index + r->next_seq * opt.conns)
                      % message_count;
    const message_t *m = &messages[index];
    if (m->header_len)
        out_printf(c, "HPUB %.*s %s.%ld %u %u\r\n", (int)m->subject_len, m->subject,
                   r->inbox, slot, m->header_len, m->header_len + m->payload_len);
    else
        out_printf(c, "PUB %.*s %s.%ld %u\r\n", (int)m->subject_len, m->subject, r->inbox,
                   slot, m->payload_len);
    out_append(c, m->headers, m->header_len);
    out_append(c, m->payload, m->payload_len);
    out_append(c, "\r\n", 2);
}

/* A request of --size bytes on --subject, the send time first with --stamp. */
static void send_fixed(requester_t *r, conn_t *c, long slot, int64_t t) {
    out_printf(c, "PUB %s %s.%ld %ld\r\n", opt.subject, r->inbox, slot, opt.size);
    long left = opt.size;
    if (opt.stamp) {
        char stamp[STAMP_DIGITS + 1];
        snprintf(stamp, sizeof stamp, "%020lld", (long long)t);
        out_append(c, stamp, STAMP_DIGITS);
        left -= STAMP_DIGITS;
    }
    while (left > 0) {
        long n = left < (long)sizeof payload_template ? left : (long)sizeof payload_template;
        out_append(c, payload_template, (size_t)n);
        left -= n;
    }
    out_append(c, "\r\n", 2);
}

static void send_request(requester_t *r, conn_t *c, long slot) {
    int64_t t = now_ns();
    r->sent_ns[slot] = t;
    if (messages)
        send_listed(r, c, slot);
    else
        send_fixed(r, c, slot, t);
    r->outstanding++;
    r->next_seq++;
    r->w->sent++;
}

static int may_send(requester_t *r, int64_t now) {
    if (r->w->quota >= 0) return r->next_seq < r->w->quota;
    return now < deadline_ns;
}

/* The due time of the next paced request on this connection. */
static int64_t due_ns(requester_t *r) {
    double per_conn = opt.rate / (double)opt.conns;
    return run_start_ns + (int64_t)((double)r->next_seq * 1e9 / per_conn);
}

static void slot_answered(requester_t *r, conn_t *c, long slot, int error, int no_responders);

static void on_reply(void *ctx, conn_t *c, const msg_t *m) {
    const char *dot = memrchr(m->subject, '.', m->subject_len);
    if (!dot) return;
    long slot = strtol(dot + 1, NULL, 10);
    int no_responders = m->header_len > 0 && m->total_len == m->header_len &&
                        memmem(m->body, m->header_len, " 503", 4) != NULL;
    int error = !no_responders && memmem(m->body + m->header_len,
                                         m->total_len - m->header_len, "\"error\"", 7);
    slot_answered(ctx, c, slot, error, no_responders);
}

/* Handles every complete frame in c->in (--protocol frames); keeps an incomplete tail. */
static void parse_frames(conn_t *c, requester_t *r) {
    size_t pos = 0;
    while (c->in_len - pos >= 14) {
        const char *at = c->in + pos;
        uint32_t length = be32(at);
        if (length < 10 || length > PAYLOAD_MAX) die("bad frame length %u", length);
        if (c->in_len - pos < 4 + (size_t)length) break;
        int kind = (unsigned char)at[8];
        if (r) slot_answered(r, c, (long)be32(at + 4) - 1, kind == 3, 0);
        else if (kind != 2) die("the broker refused the HELLO");
        pos += 4 + (size_t)length;
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
}

/* --protocol frames: the first listed frame (HELLO), then its response. */
static void frames_hello(conn_t *c) {
    out_append(c, messages[0].payload, messages[0].payload_len);
    if (flush_out(c) < 0) die("write failed during the HELLO");
    int64_t until = now_ns() + (int64_t)(opt.timeout_s * 1e9);
    while (c->in_len < 4 || c->in_len < 4 + (size_t)be32(c->in)) {
        int rc = read_some(c, until);
        if (rc < 0) die("connection closed during the HELLO");
        if (rc == 0) die("no HELLO response within %.0f s", opt.timeout_s);
    }
    parse_frames(c, NULL);
}

static void slot_answered(requester_t *r, conn_t *c, long slot, int error, int no_responders) {
    worker_t *w = r->w;
    int64_t t = now_ns();
    if (slot < 0 || slot >= opt.inflight) return;
    r->outstanding--;
    w->acked++;
    if (no_responders) w->no_responders++;
    else if (error) w->errors++;
    if (t >= measure_from_ns && (w->quota >= 0 || t <= deadline_ns)) {
        w->counted++;
        int64_t latency = t - r->sent_ns[slot];
        w->counts[bucket_of(latency > 0 ? (uint64_t)latency : 0)]++;
    }
    if (opt.rate > 0) r->free_slots[r->free_count++] = slot;
    else if (may_send(r, t)) send_request(r, c, slot);
}

static void *request_worker(void *arg) {
    worker_t *w = arg;
    conn_t c = {0};
    requester_t r = {.w = w};
    r.sent_ns = calloc((size_t)opt.inflight, sizeof(int64_t));
    r.free_slots = calloc((size_t)opt.inflight, sizeof(long));
    if (!r.sent_ns || !r.free_slots) die("out of memory");
    for (long slot = opt.inflight - 1; slot >= 0; slot--) r.free_slots[r.free_count++] = slot;
    snprintf(r.inbox, sizeof r.inbox, "_LOADGEN.%d.%d.%d", (int)getpid(), w->index,
             (int)(now_ns() % 1000000));
    c.fd = dial();
    if (opt.frames) {
        frames_hello(&c);
    } else {
        char sub[128];
        snprintf(sub, sizeof sub, "SUB %s.* 1\r\n", r.inbox);
        handshake(&c, sub);
    }
    while (now_ns() < run_start_ns) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (opt.rate <= 0) {
        for (long slot = 0; slot < opt.inflight && may_send(&r, now_ns()); slot++)
            send_request(&r, &c, slot);
    }
    int64_t drain_until = 0;
    for (;;) {
        int64_t t = now_ns();
        if (opt.rate > 0) {
            /* paced: a slot is free once its reply came */
            while (may_send(&r, t) && r.free_count > 0 && due_ns(&r) <= t)
                send_request(&r, &c, r.free_slots[--r.free_count]);
        }
        if (c.out_len && flush_out(&c) < 0) {
            snprintf(w->failure, sizeof w->failure, "write failed: %s", strerror(errno));
            break;
        }
        if (!may_send(&r, t) && r.outstanding == 0) break;
        int64_t until;
        if (!may_send(&r, t)) {
            if (!drain_until) drain_until = t + (int64_t)(opt.timeout_s * 1e9);
            until = drain_until;
        } else {
            until = t + (int64_t)(opt.timeout_s * 1e9);
            if (opt.rate > 0 && r.free_count > 0) until = due_ns(&r);
            if (w->quota < 0 && deadline_ns < until) until = deadline_ns;
        }
        int rc = read_some(&c, until > t ? until : t + 1);
        if (rc < 0) {
            snprintf(w->failure, sizeof w->failure, "connection closed by the server");
            break;
        }
        if (rc == 0) {
            int64_t now = now_ns();
            if (drain_until && now >= drain_until) {
                w->timed_out = 1;
                break;
            }
            if (!drain_until && opt.rate <= 0 && w->quota >= 0 && r.outstanding > 0) {
                w->timed_out = 1;  /* nothing for timeout_s with requests outstanding */
                break;
            }
            continue;
        }
        if (opt.frames) parse_frames(&c, &r);
        else parse(&c, on_reply, &r);
    }
    conn_close(&c);
    free(r.sent_ns);
    free(r.free_slots);
    free(c.in);
    free(c.out);
    return NULL;
}

static double cpu_s(struct timeval tv) { return (double)tv.tv_sec + (double)tv.tv_usec / 1e6; }

static void run_requests(void) {
    worker_t *workers = calloc((size_t)opt.conns, sizeof(worker_t));
    pthread_t *threads = calloc((size_t)opt.conns, sizeof(pthread_t));
    if (!workers || !threads) die("out of memory");
    int64_t now = now_ns();
    run_start_ns = opt.start_at_ns > now ? opt.start_at_ns : now + 50000000LL;
    measure_from_ns = opt.count > 0 ? 0 : run_start_ns + (int64_t)(opt.warmup_s * 1e9);
    deadline_ns = opt.count > 0 ? INT64_MAX
                                : measure_from_ns + (int64_t)(opt.duration_s * 1e9);
    for (long i = 0; i < opt.conns; i++) {
        workers[i].index = (int)i;
        workers[i].quota = opt.count > 0 ? opt.count / opt.conns + (i < opt.count % opt.conns)
                                         : -1;
        if (pthread_create(&threads[i], NULL, request_worker, &workers[i]) != 0)
            die("cannot start a thread");
    }
    for (long i = 0; i < opt.conns; i++) pthread_join(threads[i], NULL);
    int64_t end_ns = opt.count > 0 ? now_ns() : deadline_ns;
    long long sent = 0, acked = 0, counted = 0, errors = 0, no_resp = 0;
    int timed_out = 0;
    const char *failure = "";
    static uint64_t total[BUCKETS];
    for (long i = 0; i < opt.conns; i++) {
        worker_t *w = &workers[i];
        sent += w->sent;
        acked += w->acked;
        counted += w->counted;
        errors += w->errors;
        no_resp += w->no_responders;
        timed_out |= w->timed_out;
        if (w->failure[0]) failure = w->failure;
        for (int b = 0; b < BUCKETS; b++) total[b] += w->counts[b];
    }
    int64_t from = opt.count > 0 ? run_start_ns : measure_from_ns;
    double elapsed = (double)(end_ns - from) / 1e9;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"mode\":\"request\",\"subject\":\"%s\",\"size\":%ld,\"conns\":%ld,"
           "\"inflight\":%ld,\"rate\":%.3f,\"sent\":%lld,\"acked\":%lld,\"counted\":%lld,"
           "\"errors\":%lld,\"no_responders\":%lld,\"timed_out\":%s,\"failure\":\"%s\","
           "\"start_ns\":%lld,\"end_ns\":%lld,\"elapsed_s\":%.6f,\"msgs_per_s\":%.3f,"
           "\"cpu_user_s\":%.6f,\"cpu_sys_s\":%.6f,"
           "\"histogram\":{\"sub_bucket_bits\":%d,\"unit\":\"ns\",\"counts\":[",
           opt.subject, opt.size, opt.conns, opt.inflight, opt.rate, sent, acked, counted,
           errors, no_resp, timed_out ? "true" : "false", failure, (long long)from,
           (long long)end_ns, elapsed, elapsed > 0 ? (double)counted / elapsed : 0.0,
           cpu_s(ru.ru_utime), cpu_s(ru.ru_stime), SUB_BUCKET_BITS);
    int first = 1;
    for (int b = 0; b < BUCKETS; b++) {
        if (!total[b]) continue;
        printf("%s[%d,%llu]", first ? "" : ",", b, (unsigned long long)total[b]);
        first = 0;
    }
    printf("]}}\n");
    fflush(stdout);
    free(workers);
    free(threads);
    if (failure[0]) {
        fprintf(stderr, "loadgen: %s\n", failure);
        exit(1);
    }
}

/* -- respond mode ----------------------------------------------------------------------- */

static void on_request(void *ctx, conn_t *c, const msg_t *m) {
    long long *answered = ctx;
    if (!m->reply) return;
    out_append(c, "PUB ", 4);
    out_append(c, m->reply, m->reply_len);
    out_append(c, " 3\r\n+OK\r\n", 9);
    (*answered)++;
}

static void *respond_worker(void *arg) {
    conn_t *c = arg;
    long long answered = 0;
    int64_t until = opt.duration_s > 0 ? now_ns() + (int64_t)(opt.duration_s * 1e9) : 0;
    for (;;) {
        int rc = read_some(c, until);
        if (rc <= 0) break;
        parse(c, on_request, &answered);
        if (c->out_len && flush_out(c) < 0) break;
    }
    return NULL;
}

static void run_responder(void) {
    conn_t *conns = calloc((size_t)opt.conns, sizeof(conn_t));
    pthread_t *threads = calloc((size_t)opt.conns, sizeof(pthread_t));
    if (!conns || !threads) die("out of memory");
    char sub[512];
    snprintf(sub, sizeof sub, "SUB %s loadgen 1\r\n", opt.subject);
    for (long i = 0; i < opt.conns; i++) {
        conns[i].fd = dial();
        handshake(&conns[i], sub);
    }
    printf("ready\n");
    fflush(stdout);
    for (long i = 0; i < opt.conns; i++)
        if (pthread_create(&threads[i], NULL, respond_worker, &conns[i]) != 0)
            die("cannot start a thread");
    for (long i = 0; i < opt.conns; i++) pthread_join(threads[i], NULL);
}

/* --protocol frames: answer every request frame with an empty response frame. */
static void *frames_respond_worker(void *arg) {
    conn_t *c = arg;
    for (;;) {
        if (read_some(c, 0) <= 0) break;
        size_t pos = 0;
        while (c->in_len - pos >= 14) {
            const char *at = c->in + pos;
            uint32_t length = be32(at);
            if (length < 10 || length > PAYLOAD_MAX) goto done;
            if (c->in_len - pos < 4 + (size_t)length) break;
            char answer[14] = {0, 0, 0, 10};
            memcpy(answer + 4, at + 4, 4);  /* the correlation id */
            answer[8] = 2;                  /* a response */
            answer[9] = at[9];              /* to the request's op */
            out_append(c, answer, sizeof answer);
            pos += 4 + (size_t)length;
        }
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
        if (c->out_len && flush_out(c) < 0) break;
    }
done:
    conn_close(c);
    free(c->in);
    free(c->out);
    free(c);
    return NULL;
}

static void run_frames_responder(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(opt.port))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 64) != 0)
        die("cannot listen on 127.0.0.1:%s: %s", opt.port, strerror(errno));
    socklen_t len = sizeof addr;
    getsockname(fd, (struct sockaddr *)&addr, &len);
    printf("ready %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (;;) {
        int conn_fd = accept(fd, NULL, NULL);
        if (conn_fd < 0) {
            if (errno == EINTR) continue;
            die("accept failed: %s", strerror(errno));
        }
        setsockopt(conn_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn_t *c = calloc(1, sizeof(conn_t));
        if (!c) die("out of memory");
        c->fd = conn_fd;
        pthread_t thread;
        if (pthread_create(&thread, NULL, frames_respond_worker, c) != 0)
            die("cannot start a thread");
        pthread_detach(thread);
    }
}

/* -- the command line ------------------------------------------------------------------- */

static uint32_t be_read(const unsigned char *at, int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++) v = (v << 8) | at[i];
    return v;
}

/* Reads the --messages file whole and indexes its records. */
static void load_messages(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) die("cannot read %s", path);
    long size = ftell(f);
    if (size <= 0) die("%s holds no messages", path);
    rewind(f);
    unsigned char *data = malloc((size_t)size);
    if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) die("cannot read %s", path);
    fclose(f);
    long long cap = 1024;
    messages = malloc((size_t)cap * sizeof(message_t));
    if (!messages) die("out of memory");
    long pos = 0;
    while (pos < size) {
        message_t m;
        if (pos + 2 > size) die("%s: truncated record at byte %ld", path, pos);
        m.subject_len = be_read(data + pos, 2);
        m.subject = (const char *)data + pos + 2;
        pos += 2 + (long)m.subject_len;
        if (pos + 4 > size) die("%s: truncated record at byte %ld", path, pos);
        m.header_len = be_read(data + pos, 4);
        m.headers = (const char *)data + pos + 4;
        pos += 4 + (long)m.header_len;
        if (pos + 4 > size) die("%s: truncated record at byte %ld", path, pos);
        m.payload_len = be_read(data + pos, 4);
        m.payload = (const char *)data + pos + 4;
        pos += 4 + (long)m.payload_len;
        if (pos > size || m.subject_len == 0 || m.payload_len > PAYLOAD_MAX)
            die("%s: bad record ending at byte %ld", path, pos);
        if (message_count == cap) {
            cap *= 2;
            messages = realloc(messages, (size_t)cap * sizeof(message_t));
            if (!messages) die("out of memory");
        }
        messages[message_count++] = m;
    }
}

static void usage(void) {
    fputs("usage: loadgen --url HOST:PORT --subject S [--mode request|respond] [--size B]\n"
          "       [--inflight N] [--conns C] (--count N | --duration S [--warmup S])\n"
          "       [--rate MSGS_PER_S] [--stamp] [--timeout S] [--start-at MONOTONIC_NS]\n"
          "       [--messages FILE [--first-message N]]\n"
          "       [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] [--protocol nats|frames]\n",
          stderr);
    exit(2);
}

static void parse_url(char *url) {
    if (strncmp(url, "nats://", 7) == 0 || strncmp(url, "tls://", 6) == 0)
        url = strchr(url, '/') + 2;
    char *colon = strrchr(url, ':');
    if (!colon) die("--url needs HOST:PORT, got %s", url);
    *colon = '\0';
    opt.host = url;
    opt.port = colon + 1;
}

int main(int argc, char **argv) {
    opt = (options_t){.mode = "request", .size = 128, .inflight = 1, .conns = 1,
                      .timeout_s = 60.0};
    if (argc == 3 && strcmp(argv[1], "--bucket-of") == 0) {  /* for the tests of histogram.py */
        printf("%d\n", bucket_of(strtoull(argv[2], NULL, 10)));
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--stamp") == 0) { opt.stamp = 1; continue; }
        if (i + 1 >= argc) usage();
        char *v = argv[++i];
        if (strcmp(a, "--url") == 0) parse_url(v);
        else if (strcmp(a, "--mode") == 0) opt.mode = v;
        else if (strcmp(a, "--subject") == 0) opt.subject = v;
        else if (strcmp(a, "--size") == 0) opt.size = strtol(v, NULL, 10);
        else if (strcmp(a, "--inflight") == 0) opt.inflight = strtol(v, NULL, 10);
        else if (strcmp(a, "--conns") == 0) opt.conns = strtol(v, NULL, 10);
        else if (strcmp(a, "--count") == 0) opt.count = strtoll(v, NULL, 10);
        else if (strcmp(a, "--duration") == 0) opt.duration_s = strtod(v, NULL);
        else if (strcmp(a, "--warmup") == 0) opt.warmup_s = strtod(v, NULL);
        else if (strcmp(a, "--rate") == 0) opt.rate = strtod(v, NULL);
        else if (strcmp(a, "--timeout") == 0) opt.timeout_s = strtod(v, NULL);
        else if (strcmp(a, "--start-at") == 0) opt.start_at_ns = strtoll(v, NULL, 10);
        else if (strcmp(a, "--messages") == 0) opt.messages = v;
        else if (strcmp(a, "--first-message") == 0) opt.first_message = strtoll(v, NULL, 10);
        else if (strcmp(a, "--tls-ca") == 0) opt.tls_ca = v;
        else if (strcmp(a, "--tls-cert") == 0) opt.tls_cert = v;
        else if (strcmp(a, "--tls-key") == 0) opt.tls_key = v;
        else if (strcmp(a, "--protocol") == 0) {
            if (strcmp(v, "frames") == 0) opt.frames = 1;
            else if (strcmp(v, "nats") != 0) die("--protocol is nats or frames");
        }
        else usage();
    }
    if (opt.frames && !opt.subject) opt.subject = "frames";  /* the JSON output names it */
    if (!opt.host || !opt.subject) usage();
    if (strchr(opt.subject, ' ') || strlen(opt.subject) > 255) die("bad subject");
    if (opt.conns < 1 || opt.conns > 1024) die("--conns must be 1..1024");
    if (opt.timeout_s <= 0) die("--timeout must be positive");
    if (!opt.tls_cert != !opt.tls_key) die("give --tls-cert and --tls-key together");
    if (opt.tls_cert && !opt.tls_ca) die("--tls-cert needs --tls-ca");
    if (opt.tls_ca) tls_setup();
    signal(SIGPIPE, SIG_IGN);
    memset(payload_template, 'x', sizeof payload_template);
    if (strcmp(opt.mode, "respond") == 0) {
        if (opt.frames) run_frames_responder();
        else run_responder();
        return 0;
    }
    if (opt.frames && (!opt.messages || opt.tls_ca || opt.rate > 0))
        die("--protocol frames needs --messages (and takes no --tls-ca or --rate)");
    if (strcmp(opt.mode, "request") != 0) die("--mode is request or respond");
    if (opt.size < 0 || opt.size > PAYLOAD_MAX) die("--size must be 0..%d", PAYLOAD_MAX);
    if (opt.stamp && opt.size < STAMP_DIGITS) die("--stamp needs --size >= %d", STAMP_DIGITS);
    if (opt.inflight < 1 || opt.inflight > INFLIGHT_MAX) die("--inflight must be 1..%d",
                                                            INFLIGHT_MAX);
    if ((opt.count > 0) == (opt.duration_s > 0)) die("give --count or --duration");
    if (opt.count > 0 && opt.count < opt.conns) die("--count must be at least --conns");
    if (opt.rate < 0 || opt.warmup_s < 0) die("--rate and --warmup must not be negative");
    if (opt.first_message < 0) die("--first-message must not be negative");
    if (opt.messages) {
        if (opt.stamp) die("--stamp and --messages do not go together");
        load_messages(opt.messages);
        if (opt.frames && message_count < 2) die("--messages needs the HELLO and a request");
    }
    run_requests();
    return 0;
}
