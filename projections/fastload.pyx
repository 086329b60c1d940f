# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""The replay loader's common case in C (projections/fastload.py builds, checks and loads this module).

`Batch.run` does for a record what projections.bulk.load's loop does, byte for byte in its effects, when the
record is of the common kind: a history entry of the current schema in seq order with no links or metadata,
a result with no holds whose key is new in the share, or a balance record with plain integer amounts; every
string ASCII, every number in 64 bits. Rows go straight from the record's bytes to SQLite's prepared
statements (no Python string, dict or tuple per row); history rows when the share ends (`flush`), in the
table's key order, and result rows then too, sorted by their key. For a PostgreSQL loader they go into COPY's
binary format instead (`copies`). A balance record is only read far enough to know it is
well formed and whether it is its account's latest so far; the latest one's bytes are decoded once, when the
Python loop is handed a record or the batch closes (`_settle`), not every one of the account's versions.
Anything else (a record it cannot decode, an older schema, an out-of-order seq, links, a retried result,
non-ASCII text) it leaves untouched and hands back to the Python loop, which is the source of truth; the loop
takes that one record and calls back. So nothing it does not fully apply has been applied.

`Batch.drain` does the same for records it reads itself from librdkafka (`Reader`: the loader's partitions
forwarded to a queue of its own), from each message's payload, with no Python object per record; what it does
not take goes to the Python loop as `Record` objects.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from libc.stdlib cimport qsort
from libc.stdio cimport snprintf
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeASCII
from cpython.object cimport PyObject_Hash
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free

cdef extern from *:
    """
    #include <dlfcn.h>
    typedef struct sqlite3 sqlite3;
    typedef struct sqlite3_stmt sqlite3_stmt;
    /* The few functions of SQLite used here, taken from the library the interpreter's sqlite3 module has
       loaded already (dlopen with RTLD_NOLOAD): the same instance that owns the connection's handle, with no
       header or link-time dependency of this module's own. */
    static struct {
        int (*prepare)(sqlite3*, const char*, int, sqlite3_stmt**, const char**);
        int (*bind_text)(sqlite3_stmt*, int, const char*, int, void (*)(void*));
        int (*bind_int64)(sqlite3_stmt*, int, long long);
        int (*bind_null)(sqlite3_stmt*, int);
        int (*step)(sqlite3_stmt*);
        int (*reset)(sqlite3_stmt*);
        int (*finalize)(sqlite3_stmt*);
        const char* (*errmsg)(sqlite3*);
        const char* (*db_filename)(sqlite3*, const char*);
        void* (*db_mutex)(sqlite3*);
        void (*mutex_enter)(void*);
        void (*mutex_leave)(void*);
    } SQ;
    static int sq_bind(const char* path) {
        void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (!h) return -1;
        SQ.prepare = (int (*)(sqlite3*, const char*, int, sqlite3_stmt**, const char**))dlsym(h, "sqlite3_prepare_v2");
        SQ.bind_text = (int (*)(sqlite3_stmt*, int, const char*, int, void (*)(void*)))dlsym(h, "sqlite3_bind_text");
        SQ.bind_int64 = (int (*)(sqlite3_stmt*, int, long long))dlsym(h, "sqlite3_bind_int64");
        SQ.bind_null = (int (*)(sqlite3_stmt*, int))dlsym(h, "sqlite3_bind_null");
        SQ.step = (int (*)(sqlite3_stmt*))dlsym(h, "sqlite3_step");
        SQ.reset = (int (*)(sqlite3_stmt*))dlsym(h, "sqlite3_reset");
        SQ.finalize = (int (*)(sqlite3_stmt*))dlsym(h, "sqlite3_finalize");
        SQ.errmsg = (const char* (*)(sqlite3*))dlsym(h, "sqlite3_errmsg");
        SQ.db_filename = (const char* (*)(sqlite3*, const char*))dlsym(h, "sqlite3_db_filename");
        SQ.db_mutex = (void* (*)(sqlite3*))dlsym(h, "sqlite3_db_mutex");
        SQ.mutex_enter = (void (*)(void*))dlsym(h, "sqlite3_mutex_enter");
        SQ.mutex_leave = (void (*)(void*))dlsym(h, "sqlite3_mutex_leave");
        dlclose(h);  /* RTLD_NOLOAD took a reference; the sqlite3 module keeps its own */
        return (SQ.prepare && SQ.bind_text && SQ.bind_int64 && SQ.bind_null && SQ.step && SQ.reset
                && SQ.finalize && SQ.errmsg && SQ.db_filename && SQ.db_mutex && SQ.mutex_enter
                && SQ.mutex_leave) ? 0 : -1;
    }
    /* CPython's sqlite3.Connection begins with its sqlite3 handle (Modules/_sqlite/connection.h, 3.11-3.13);
       fastload.py checks the handle's file name against the one the connection opened before using it. */
    typedef struct { PyObject_HEAD sqlite3* db; } sq_connection;
    static sqlite3* sq_handle(PyObject* c) { return ((sq_connection*)c)->db; }
    /* SQLITE_STATIC: the text stays where it is (the record's bytes) until the statement has run */
    static int sq_text(sqlite3_stmt* s, int i, const char* p, int n) { return SQ.bind_text(s, i, p, n, (void (*)(void*))0); }
    static int sq_add(long long a, long long b, long long* r) { return __builtin_add_overflow(a, b, r); }
    #define SQ_OK 0
    #define SQ_DONE 101
    """
    ctypedef struct sqlite3
    ctypedef struct sqlite3_stmt
    ctypedef struct _sq:
        int (*prepare)(sqlite3*, const char*, int, sqlite3_stmt**, const char**)
        int (*bind_text)(sqlite3_stmt*, int, const char*, int, void (*)(void*))
        int (*bind_int64)(sqlite3_stmt*, int, long long)
        int (*bind_null)(sqlite3_stmt*, int)
        int (*step)(sqlite3_stmt*)
        int (*reset)(sqlite3_stmt*)
        int (*finalize)(sqlite3_stmt*)
        const char* (*errmsg)(sqlite3*)
        const char* (*db_filename)(sqlite3*, const char*)
        void* (*db_mutex)(sqlite3*)
        void (*mutex_enter)(void*)
        void (*mutex_leave)(void*)
    _sq SQ
    int sq_bind(const char* path)
    sqlite3* sq_handle(object c)
    int sq_text(sqlite3_stmt* s, int i, const char* p, int n)
    int sq_add(long long a, long long b, long long* r)
    int SQ_OK
    int SQ_DONE


cdef extern from *:
    """
    typedef struct rd_kafka_s rd_kafka_t;
    typedef struct rd_kafka_queue_s rd_kafka_queue_t;
    typedef struct rd_kafka_topic_s rd_kafka_topic_t;
    typedef struct rd_kafka_op_s rd_kafka_event_t;
    /* librdkafka's message as rdkafka.h declares it (public: part of the library's ABI) */
    typedef struct rd_kafka_message_s {
        int err;
        rd_kafka_topic_t *rkt;
        int32_t partition;
        void *payload;
        size_t len;
        void *key;
        size_t key_len;
        int64_t offset;
        void *_private;
    } rd_kafka_message_t;
    /* The few functions of librdkafka used here, from the library confluent-kafka has loaded (as SQLite's). */
    static struct {
        const char* (*name)(const rd_kafka_t*);
        int (*type)(const rd_kafka_t*);
        rd_kafka_queue_t* (*queue_new)(rd_kafka_t*);
        rd_kafka_queue_t* (*partition_queue)(rd_kafka_t*, const char*, int32_t);
        void (*forward)(rd_kafka_queue_t*, rd_kafka_queue_t*);
        void (*queue_destroy)(rd_kafka_queue_t*);
        rd_kafka_event_t* (*queue_poll)(rd_kafka_queue_t*, int);
        int (*event_type)(const rd_kafka_event_t*);
        const rd_kafka_message_t* (*event_message_next)(rd_kafka_event_t*);
        const char* (*event_error_string)(rd_kafka_event_t*);
        void (*event_destroy)(rd_kafka_event_t*);
        const char* (*topic_name)(const rd_kafka_topic_t*);
        const char* (*err2str)(int);
    } RK;
    static int rk_bind(const char* path) {
        void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (!h) return -1;
        *(void**)&RK.name = dlsym(h, "rd_kafka_name");
        *(void**)&RK.type = dlsym(h, "rd_kafka_type");
        *(void**)&RK.queue_new = dlsym(h, "rd_kafka_queue_new");
        *(void**)&RK.partition_queue = dlsym(h, "rd_kafka_queue_get_partition");
        *(void**)&RK.forward = dlsym(h, "rd_kafka_queue_forward");
        *(void**)&RK.queue_destroy = dlsym(h, "rd_kafka_queue_destroy");
        *(void**)&RK.queue_poll = dlsym(h, "rd_kafka_queue_poll");
        *(void**)&RK.event_type = dlsym(h, "rd_kafka_event_type");
        *(void**)&RK.event_message_next = dlsym(h, "rd_kafka_event_message_next");
        *(void**)&RK.event_error_string = dlsym(h, "rd_kafka_event_error_string");
        *(void**)&RK.event_destroy = dlsym(h, "rd_kafka_event_destroy");
        *(void**)&RK.topic_name = dlsym(h, "rd_kafka_topic_name");
        *(void**)&RK.err2str = dlsym(h, "rd_kafka_err2str");
        dlclose(h);  /* confluent-kafka keeps the library loaded */
        return (RK.name && RK.type && RK.queue_new && RK.partition_queue && RK.forward && RK.queue_destroy
                && RK.queue_poll && RK.event_type && RK.event_message_next && RK.event_error_string
                && RK.event_destroy && RK.topic_name && RK.err2str) ? 0 : -1;
    }
    /* confluent-kafka's clients begin with their librdkafka handle (Handle in its confluent_kafka.h, the same
       since 2016); fastload.py checks the handle's name against the client.id the consumer was given first. */
    typedef struct { PyObject_HEAD rd_kafka_t* rk; } rk_client;
    static rd_kafka_t* rk_handle(PyObject* c) { return ((rk_client*)c)->rk; }
    #define RK_CONSUMER 1
    #define RK_BATCH 10000
    #define RK_EVENT_FETCH 0x2
    #define RK_EVENT_ERROR 0x8
    """
    ctypedef struct rd_kafka_t
    ctypedef struct rd_kafka_queue_t
    ctypedef struct rd_kafka_topic_t
    ctypedef struct rd_kafka_event_t
    ctypedef struct rd_kafka_message_t:
        int err
        rd_kafka_topic_t* rkt
        int32_t partition
        void* payload
        size_t len
        int64_t offset
    ctypedef struct _rk:
        const char* (*name)(const rd_kafka_t*)
        int (*type)(const rd_kafka_t*)
        rd_kafka_queue_t* (*queue_new)(rd_kafka_t*)
        rd_kafka_queue_t* (*partition_queue)(rd_kafka_t*, const char*, int32_t)
        void (*forward)(rd_kafka_queue_t*, rd_kafka_queue_t*)
        void (*queue_destroy)(rd_kafka_queue_t*)
        rd_kafka_event_t* (*queue_poll)(rd_kafka_queue_t*, int) nogil
        int (*event_type)(const rd_kafka_event_t*) nogil
        const rd_kafka_message_t* (*event_message_next)(rd_kafka_event_t*) nogil
        const char* (*event_error_string)(rd_kafka_event_t*) nogil
        void (*event_destroy)(rd_kafka_event_t*) nogil
        const char* (*topic_name)(const rd_kafka_topic_t*)
        const char* (*err2str)(int)
    _rk RK
    int rk_bind(const char* path)
    rd_kafka_t* rk_handle(object c)
    int RK_CONSUMER
    enum: RK_BATCH
    int RK_EVENT_FETCH
    int RK_EVENT_ERROR


def bind_kafka(path: bytes) -> bool:
    """Take librdkafka's functions from the library at path, which must be loaded in this process already."""
    return rk_bind(path) == 0


def kafka_name(consumer) -> str:
    """The name librdkafka gives the consumer's handle ("<client.id>#consumer-<n>"), "" if it is no consumer's
    (for fastload.py's check)."""
    cdef rd_kafka_t* rk = rk_handle(consumer)
    if rk == NULL or RK.type(rk) != RK_CONSUMER:
        return ""
    return (<bytes>RK.name(rk)).decode()


cdef class Reader:
    """A loader's partitions read straight from librdkafka, without a Python object per record.

    Each partition's fetch queue is forwarded to a queue of the reader's own before the consumer is assigned
    them (forwarded by the application, librdkafka leaves it so when it starts fetching; nothing here assigns a
    partition twice, and one that were would stay forwarded). The queue is read with librdkafka's event API,
    which hands every error over as an event: a partition's fetch queue can carry an error (its topic deleted,
    its reading no longer authorized), and reading it the way `consume()` does would call confluent-kafka's
    error callback outside the thread state it sets up for it (a process abort). The consumer's own queue
    (logs, errors not about a partition) is left to confluent-kafka (`bulk.load` polls it between batches)."""

    cdef rd_kafka_queue_t* q
    cdef object consumer  # its handle must outlive the queue
    cdef rd_kafka_event_t** events  # those of the records `read` took last, until `release`
    cdef rd_kafka_message_t** messages
    cdef public Py_ssize_t errors  # error events read so far
    cdef public Py_ssize_t reported  # of them, those its user has reported (bulk.load logs them)
    cdef public str last_error

    def __cinit__(self):
        self.events = <rd_kafka_event_t**>PyMem_Malloc(RK_BATCH * sizeof(rd_kafka_event_t*))
        self.messages = <rd_kafka_message_t**>PyMem_Malloc(RK_BATCH * sizeof(rd_kafka_message_t*))
        if self.events == NULL or self.messages == NULL:
            raise MemoryError()

    def __init__(self, consumer, list partitions):
        """partitions: [(physical topic, partition)], not assigned yet."""
        cdef rd_kafka_t* rk = rk_handle(consumer)
        cdef rd_kafka_queue_t* partition_queue
        self.consumer = consumer
        self.errors = self.reported = 0
        self.last_error = ""
        self.q = RK.queue_new(rk)
        if self.q == NULL:
            raise RuntimeError("librdkafka made no queue")
        for topic, partition in partitions:
            partition_queue = RK.partition_queue(rk, topic.encode(), partition)
            if partition_queue == NULL:
                raise RuntimeError(f"librdkafka has no queue for {topic}/{partition}")
            RK.forward(partition_queue, self.q)
            RK.queue_destroy(partition_queue)

    cdef Py_ssize_t read(self, Py_ssize_t want, int timeout_ms) except -1:
        """Up to `want` records into `messages` (waiting at most timeout_ms for the first event, then taking
        what is there); they stay valid until `release`. Error events are counted and their text kept."""
        cdef Py_ssize_t n = 0, errors = 0
        cdef rd_kafka_event_t* event
        cdef rd_kafka_message_t* message
        cdef int kind
        cdef char text[512]
        if self.q == NULL or rk_handle(self.consumer) == NULL:
            raise RuntimeError("the reader or its consumer is closed")
        want = max(1, min(want, RK_BATCH))
        text[0] = 0
        with nogil:
            event = RK.queue_poll(self.q, timeout_ms)
            while event != NULL:
                kind = RK.event_type(event)
                message = <rd_kafka_message_t*>RK.event_message_next(event) if kind == RK_EVENT_FETCH else NULL
                if message != NULL:
                    self.events[n] = event
                    self.messages[n] = message
                    n += 1
                else:
                    if kind == RK_EVENT_ERROR:
                        errors += 1
                        snprintf(text, sizeof(text), "%s", RK.event_error_string(event))
                    RK.event_destroy(event)
                if n >= want:
                    break
                event = RK.queue_poll(self.q, 0)
        if errors:
            self.errors += errors
            self.last_error = text.decode("utf-8", "replace")
        return n

    cdef void release(self, Py_ssize_t n) noexcept:
        """The records `read` took (their events)."""
        cdef Py_ssize_t i
        for i in range(n):
            RK.event_destroy(self.events[i])

    def skim(self, Py_ssize_t want, int timeout_ms):
        """Read up to `want` records and drop them: how many. The benchmark's read in C, the loaders' way of
        reading with nothing done per record."""
        cdef Py_ssize_t n = self.read(want, timeout_ms)
        self.release(n)
        return n

    def close(self):
        """Before the consumer closes (after, its handle is gone and the queue is left as it is)."""
        if self.q != NULL and self.consumer is not None and rk_handle(self.consumer) != NULL:
            RK.queue_destroy(self.q)
        self.q = NULL

    def __dealloc__(self):
        self.close()
        PyMem_Free(self.events)
        PyMem_Free(self.messages)


cdef class Record:
    """A record the reader read, for the Python loop: the methods of confluent_kafka.Message it calls."""

    cdef object _topic, _value, _error
    cdef int32_t _partition
    cdef int64_t _offset

    def error(self):
        return self._error

    def topic(self):
        return self._topic

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def value(self):
        return self._value


cdef Record _record(rd_kafka_message_t* m):
    cdef Record r = Record.__new__(Record)
    r._topic = "" if m.rkt == NULL else (<bytes>RK.topic_name(m.rkt)).decode()
    r._partition = m.partition
    r._offset = m.offset
    r._value = None if m.payload == NULL else PyBytes_FromStringAndSize(<const char*>m.payload, m.len)
    r._error = None if m.err == 0 else f"librdkafka: {(<bytes>RK.err2str(m.err)).decode()}"
    return r


def bind_library(path: bytes) -> bool:
    """Take SQLite's functions from the library at path, which must be loaded in this process already."""
    return sq_bind(path) == 0


def defer_bytes(n=None) -> int:
    """How many bytes of history records a loader keeps before inserting them in key order (`Batch._defer`);
    n sets it (the tests make it small to take the bounded path)."""
    global DEFER_BYTES
    if n is not None:
        DEFER_BYTES = max(0, int(n))
    return DEFER_BYTES


def handle_file(conn) -> str:
    """The file of the connection's main database, as SQLite reports it (for fastload.py's check)."""
    cdef const char* name = SQ.db_filename(sq_handle(conn), b"main")
    return (<bytes>name).decode() if name != NULL else ""


# A loader keeps the history records it takes (and, for PostgreSQL, its result rows) until this many bytes of
# them, then writes them in key order (Batch._defer): about 250,000 history entries. For PostgreSQL the rows
# in COPY's format and the stream handed over add about three times as much again at a flush.
cdef Py_ssize_t DEFER_BYTES = 64 * 1024 * 1024


# --- reading the record's bytes: any irregularity makes the record the Python loop's --------------------------
cdef struct Cursor:
    const unsigned char* b
    Py_ssize_t n
    Py_ssize_t p
    bint bad


cdef struct Text:
    const char* s
    int n  # -1: null


cdef struct HistoryFields:  # a history record's fields, as _history_fields reads them
    Text entry_id, account, currency, amount, posted_after, held_after, transaction_id, kind, reference
    Text hold_id, command_id, client_id, rate
    int64_t seq, occurred, at


# --- rows for PostgreSQL's COPY, in its binary format (big-endian lengths and integers) -----------------------
cdef struct Out:
    char* b
    Py_ssize_t n, size


cdef int _reserve(Out* o, Py_ssize_t more) except -1:
    cdef Py_ssize_t size
    cdef char* grown
    if o.n + more > o.size:
        size = max(o.n + more, 2 * o.size, 1 << 16)
        grown = <char*>PyMem_Realloc(o.b, size)
        if grown == NULL:
            raise MemoryError()
        o.b = grown
        o.size = size
    return 0


cdef inline void _put32(Out* o, uint32_t v) noexcept:
    o.b[o.n] = <char>(v >> 24)
    o.b[o.n + 1] = <char>(v >> 16)
    o.b[o.n + 2] = <char>(v >> 8)
    o.b[o.n + 3] = <char>v
    o.n += 4


cdef inline void _put_fields(Out* o, int count) noexcept:
    o.b[o.n] = <char>(count >> 8)
    o.b[o.n + 1] = <char>count
    o.n += 2


cdef inline void _put_text(Out* o, Text t) noexcept:
    """A text field (t.n < 0: null); the caller reserved room for it."""
    if t.n < 0:
        _put32(o, 0xFFFFFFFF)
        return
    _put32(o, <uint32_t>t.n)
    memcpy(o.b + o.n, t.s, t.n)
    o.n += t.n


cdef inline uint32_t _get32(const char* p) noexcept nogil:
    return (<uint32_t>(<unsigned char>p[0]) << 24) | (<uint32_t>(<unsigned char>p[1]) << 16) \
        | (<uint32_t>(<unsigned char>p[2]) << 8) | <unsigned char>p[3]


cdef inline void _put_int8(Out* o, int64_t v) noexcept:
    _put32(o, 8)
    _put32(o, <uint32_t>(<uint64_t>v >> 32))
    _put32(o, <uint32_t>(<uint64_t>v & 0xFFFFFFFF))


cdef inline Text _literal(const char* s, int n) noexcept:
    cdef Text t
    t.s = s
    t.n = n
    return t


# The stream COPY ... (FORMAT BINARY) reads: a signature, flags, an empty header extension; rows; a trailer
cdef bytes COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\0" + b"\0" * 8
cdef bytes COPY_TRAILER = b"\xff\xff"


cdef object _copy_stream(Out* o):
    """The rows in o as a whole COPY stream (None when there are none); o is emptied."""
    if o.n == 0:
        return None
    return _copy_part(o, True, True)


cdef object _copy_part(Out* o, bint first, bint last):
    """The rows in o as a part of a COPY stream: the signature before them if first, the trailer after them
    if last; o is emptied."""
    cdef Py_ssize_t head = len(COPY_SIGNATURE) if first else 0
    data = PyBytes_FromStringAndSize(NULL, head + o.n + (2 if last else 0))  # one copy of the rows, not three
    cdef char* p = PyBytes_AS_STRING(data)
    memcpy(p, <const char*>COPY_SIGNATURE, head)
    memcpy(p + head, o.b, o.n)
    if last:
        memcpy(p + head + o.n, <const char*>COPY_TRAILER, 2)
    o.n = 0
    return data


cdef struct Span:  # a row in an Out buffer
    Py_ssize_t start, length


cdef const char* _sorting = NULL  # the buffer whose rows _by_result_key compares (qsort has no context)


cdef inline int _field_cmp(const char* a, const char* b, uint32_t* la, uint32_t* lb) noexcept nogil:
    """Compare two length-prefixed text fields bytewise (shorter first on a common prefix), as PostgreSQL's
    COLLATE "C" does; la, lb: their lengths."""
    cdef int c
    la[0] = _get32(a)
    lb[0] = _get32(b)
    c = memcmp(a + 4, b + 4, la[0] if la[0] < lb[0] else lb[0])
    if c != 0:
        return c
    return (la[0] > lb[0]) - (la[0] < lb[0])


cdef int _by_result_key(const void* x, const void* y) noexcept nogil:
    """Two result rows by the results table's key (client_id, command_id): its first two fields."""
    cdef const char* a = _sorting + (<const Span*>x).start + 2
    cdef const char* b = _sorting + (<const Span*>y).start + 2
    cdef uint32_t la, lb
    cdef int c = _field_cmp(a, b, &la, &lb)
    if c != 0:
        return c
    return _field_cmp(a + 4 + la, b + 4 + lb, &la, &lb)


cdef inline int64_t _long(Cursor* c) noexcept:
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef unsigned char x
    while True:
        if c.p >= c.n or shift > 56:  # at most 9 bytes here: 63 bits of zigzag, all the ledger's longs need
            c.bad = True
            return 0
        x = c.b[c.p]
        c.p += 1
        v |= (<uint64_t>(x & 0x7F)) << shift
        if not x & 0x80:
            break
        shift += 7
    return <int64_t>((v >> 1) ^ (<uint64_t>0 - (v & 1)))


cdef inline Text _text(Cursor* c) noexcept:
    cdef Text t
    cdef int64_t n = _long(c)
    cdef Py_ssize_t i
    cdef unsigned char high = 0
    t.s = NULL
    t.n = 0
    if c.bad or n < 0 or n > c.n - c.p or n > 0x7FFFFFFF:
        c.bad = True
        return t
    for i in range(c.p, c.p + n):
        high |= c.b[i]
    if high & 0x80:  # not ASCII: the Python decoder judges its UTF-8
        c.bad = True
        return t
    t.s = <const char*>(c.b + c.p)
    t.n = <int>n
    c.p += n
    return t


cdef inline Text _optional_text(Cursor* c) noexcept:
    cdef Text t
    cdef int64_t branch = _long(c)
    if branch == 0 and not c.bad:
        t.s = NULL
        t.n = -1
        return t
    if branch != 1:
        c.bad = True
        t.s = NULL
        t.n = 0
        return t
    return _text(c)


cdef inline void _empty_block(Cursor* c) noexcept:
    # An array or a map: only the empty one (a single 0 count) is the common case
    if c.p >= c.n or c.b[c.p] != 0:
        c.bad = True
        return
    c.p += 1


cdef inline bint _integer(Text t, int64_t* out) noexcept:
    """t as int() reads it, for the plain form only: an optional '-' and 1 to 18 digits."""
    cdef int i = 0
    cdef int64_t v = 0
    cdef bint negative = False
    if t.n <= 0:
        return False
    if t.s[0] == 45:  # '-'
        negative = True
        i = 1
    if t.n - i < 1 or t.n - i > 18:
        return False
    while i < t.n:
        if t.s[i] < 48 or t.s[i] > 57:  # '0' to '9'
            return False
        v = v * 10 + (t.s[i] - 48)
        i += 1
    out[0] = -v if negative else v
    return True


cdef inline void _history_fields(Cursor* c, HistoryFields* f) noexcept:
    """A history record's fields in schema order, from after its header (c.bad says if it is not one)."""
    f.entry_id = _text(c)
    f.account = _text(c)
    f.currency = _text(c)
    f.seq = _long(c)
    f.amount = _text(c)
    f.posted_after = _text(c)
    f.held_after = _text(c)
    f.transaction_id = _optional_text(c)
    f.kind = _text(c)
    f.reference = _optional_text(c)
    f.hold_id = _optional_text(c)
    f.occurred = _long(c)
    f.at = _long(c)
    f.command_id = _text(c)
    f.client_id = _text(c)
    _empty_block(c)  # links
    _empty_block(c)  # metadata
    f.rate = _optional_text(c)


cdef inline object _str(Text t):
    return PyUnicode_DecodeASCII(t.s, t.n, NULL)


cdef class Batch:
    """A loader's state, shared with bulk.load's Python loop (the same dicts, lists and sets), and the
    prepared statements of the loader's SQLite connection."""

    cdef sqlite3* db
    cdef object conn  # kept open while its statements live
    cdef sqlite3_stmt* history
    cdef sqlite3_stmt* results
    # history rows taken for SQLite, kept until `flush` (_defer): account -> [their places in the arena]
    cdef dict pending
    cdef list kept_names  # pending's accounts in order while its rows are written part by part (`history_part`)
    cdef Py_ssize_t kept_name, kept_row  # where the next part begins: that account, that row of it
    cdef char* arena
    cdef Py_ssize_t used, size
    cdef dict fast, remaining, offsets, seen, balances
    cdef dict latest  # account -> (seq, bytes): its newest balance record taken here, not decoded yet
    cdef set refold, result_keys
    cdef object balance_body
    cdef dict keys
    cdef char[10] history_header
    cdef char[10] result_header
    cdef char[10] balance_header
    cdef public Py_ssize_t applied
    cdef public double reading  # seconds drain spent waiting for librdkafka's records (not applying them)
    # Without a SQLite connection (a PostgreSQL loader): the rows taken, in COPY's binary format (`copies`)
    cdef Out history_copy, result_copy
    # ... result rows kept until `flush` sorts them by the table's key (result_spans: where each one is)
    cdef Out result_pending
    cdef Span* result_spans
    cdef Py_ssize_t result_count, result_cap
    cdef bint closed
    cdef int refused  # a bind's return codes since the last step (SQLite's, or'ed)
    # drain's partition of the record before (records come in runs of one partition): its key, kind (0
    # history, 1 results, 2 balances) and end offset (-1: not one of the loader's partitions left)
    cdef rd_kafka_topic_t* last_topic
    cdef int32_t last_partition
    cdef object last_key
    cdef int last_kind
    cdef int64_t last_until

    def __init__(self, conn, str insert_history, str insert_results, dict fast, dict remaining, dict offsets,
                 dict seen, set refold, set result_keys, dict balances, bytes history_header,
                 bytes result_header, bytes balance_header, balance_body):
        """fast: {physical topic: logical topic}; the rest as bulk.load keeps them. conn: the SQLite
        connection the rows go to, or None (a PostgreSQL loader): then they wait in COPY's binary format
        for `copies`."""
        cdef const char* tail
        self.conn = conn
        self.db = NULL if conn is None else sq_handle(conn)
        self.fast, self.remaining, self.offsets, self.seen, self.balances = fast, remaining, offsets, seen, balances
        self.refold, self.result_keys, self.balance_body = refold, result_keys, balance_body
        self.keys = {}
        self.latest = {}
        self.pending = {}
        self.applied = 0
        self.reading = 0.0
        for header in (history_header, result_header, balance_header):
            if len(header) != 10:
                raise ValueError("a schema header is 10 bytes")
        memcpy(self.history_header, <const char*>history_header, 10)
        memcpy(self.result_header, <const char*>result_header, 10)
        memcpy(self.balance_header, <const char*>balance_header, 10)
        if self.db == NULL:
            return
        encoded = insert_history.encode()
        if SQ.prepare(self.db, encoded, -1, &self.history, &tail) != SQ_OK:
            raise RuntimeError(f"SQLite: {SQ.errmsg(self.db).decode()}")
        encoded = insert_results.encode()
        if SQ.prepare(self.db, encoded, -1, &self.results, &tail) != SQ_OK:
            raise RuntimeError(f"SQLite: {SQ.errmsg(self.db).decode()}")

    def close(self):
        """The statements and the buffers. Rows kept and not flushed are dropped: bulk.load flushes before it
        closes, and closes without flushing only when the share failed (the rebuild fails with it). A closed
        batch refuses any further use."""
        self.closed = True
        try:
            self._settle()
        finally:
            self._release()

    cdef void _release(self) noexcept:
        self.pending = {}
        self.kept_names = None
        self.used = self.size = 0
        PyMem_Free(self.arena)
        self.arena = NULL
        PyMem_Free(self.history_copy.b)
        PyMem_Free(self.result_copy.b)
        PyMem_Free(self.result_pending.b)
        PyMem_Free(self.result_spans)
        self.history_copy.b = self.result_copy.b = self.result_pending.b = NULL
        self.history_copy.n = self.history_copy.size = self.result_copy.n = self.result_copy.size = 0
        self.result_pending.n = self.result_pending.size = 0
        self.result_spans = NULL
        self.result_count = self.result_cap = 0
        if self.history != NULL:
            SQ.finalize(self.history)
            self.history = NULL
        if self.results != NULL:
            SQ.finalize(self.results)
            self.results = NULL
        self.db = NULL
        self.conn = None

    cdef int _open(self) except -1:
        if self.closed:
            raise RuntimeError("fastload: the batch is closed")
        return 0

    def __dealloc__(self):
        self.close()

    cdef int _step(self, sqlite3_stmt* stmt) except -1:
        if self.refused:  # a value not bound (too long for SQLite): the statement would write the last one's
            self.refused = 0
            SQ.reset(stmt)
            raise RuntimeError("SQLite refused a value of a row")
        rc = SQ.step(stmt)
        SQ.reset(stmt)
        if rc != SQ_DONE:
            raise RuntimeError(f"SQLite: {SQ.errmsg(self.db).decode()}")
        return 0

    cdef inline void _bind(self, sqlite3_stmt* stmt, int i, Text t) noexcept:
        if t.n < 0:
            self.refused |= SQ.bind_null(stmt, i)
        else:
            self.refused |= sq_text(stmt, i, t.s, t.n)

    cdef inline void _bind_int(self, sqlite3_stmt* stmt, int i, int64_t v) noexcept:
        self.refused |= SQ.bind_int64(stmt, i, v)

    def run(self, list messages, Py_ssize_t start):
        """Apply messages[start:] in order; the index of the first one left to the Python loop (len when
        none). Without a connection, the rows wait in COPY's format for `copies`."""
        cdef Py_ssize_t i, n = len(messages)
        self._open()
        cdef Cursor c
        cdef int64_t offset, until
        cdef object msg, topic, key, data, found
        for i in range(start, n):
            msg = messages[i]
            if msg.error():
                continue
            topic = self.fast.get(msg.topic())
            if topic is None:
                return self._handed_back(i)
            partition = msg.partition()
            key = self.keys.get((topic, partition))
            if key is None:
                key = self.keys[(topic, partition)] = (topic, partition)
            offset = msg.offset()
            found = self.remaining.get(key)
            if found is None or offset >= <int64_t>found:
                continue  # past its end offset (bulk.load skips it too)
            data = msg.value()
            if type(data) is not bytes:
                return self._handed_back(i)
            c.b = <const unsigned char*>PyBytes_AS_STRING(data)
            c.n = PyBytes_GET_SIZE(data)
            c.p = 10
            c.bad = False
            if c.n < 10:
                return self._handed_back(i)
            if topic == "history":
                if memcmp(c.b, self.history_header, 10) != 0 or not self._history(&c, key, offset):
                    return self._handed_back(i)
            elif topic == "results":
                if memcmp(c.b, self.result_header, 10) != 0 or not self._result(&c, key, offset):
                    return self._handed_back(i)
            elif topic == "balances":
                if memcmp(c.b, self.balance_header, 10) != 0 or not self._balance(&c, data, key, offset):
                    return self._handed_back(i)
            else:
                return self._handed_back(i)
        return n

    def copies(self):
        """Without a connection: [(table, a whole COPY ... (FORMAT BINARY) stream of the rows taken since the
        last call)], for the tables that have some. The columns are bulk's (HISTORY_COLUMNS, RESULT_COLUMNS),
        text and int8 as PostgreSQL's DDL types them."""
        self._open()
        out = []
        data = _copy_stream(&self.history_copy)
        if data is not None:
            out.append(("history", data))
        data = _copy_stream(&self.result_copy)
        if data is not None:
            out.append(("results", data))
        return out

    def history_part(self, Py_ssize_t size):
        """Without a connection: the history rows kept, in key order (as `flush` writes them), as the next
        part of one whole COPY ... (FORMAT BINARY) stream: whole rows, about `size` bytes of them, the
        signature before the first part's and the trailer after the last's; None once every row kept was
        handed over (or none was kept). The loader sends each part while this makes the next, so the
        server reads rows while the rows after them are made (docs/read-side.md)."""
        cdef bint first, more
        self._open()
        if self.db != NULL:
            raise RuntimeError("fastload: history parts are for a loader without a SQLite connection")
        if size <= 0:
            raise ValueError("fastload: a part holds at least one row")
        if not self.pending:
            return None
        first = self.kept_names is None
        more = self._write_kept(size)
        if not more:
            self.pending.clear()
            self.used = 0
        return _copy_part(&self.history_copy, first, not more)

    def drain(self, Reader reader, Py_ssize_t want, int timeout_ms):
        """Read up to `want` records from the reader (waiting at most timeout_ms for the first) and apply them
        as `run` applies a batch of messages; (how many were read, the records from the first one left to the
        Python loop on, as Record objects it takes as it takes messages: usually none)."""
        cdef Py_ssize_t n, i = 0, j
        cdef list left = []
        cdef timespec before, after
        self._open()
        self.last_topic = NULL  # the partitions left may have changed since the last drain
        clock_gettime(CLOCK_MONOTONIC, &before)
        n = reader.read(want, timeout_ms)
        clock_gettime(CLOCK_MONOTONIC, &after)
        self.reading += (after.tv_sec - before.tv_sec) + (after.tv_nsec - before.tv_nsec) * 1e-9
        try:
            while i < n and self._apply(reader.messages[i]):
                i += 1
            if i < n:
                self._settle()  # as _handed_back
                for j in range(i, n):
                    left.append(_record(reader.messages[j]))
        finally:
            reader.release(n)
        return n, left

    cdef bint _apply(self, rd_kafka_message_t* m) except -1:
        """True when the record is taken or needs nothing (an error, past its end offset), False when it is
        the Python loop's (as `run`)."""
        cdef Cursor c
        if m.err != 0:
            return True  # a consumer error: the Python loop skips it too
        if m.rkt != self.last_topic or m.partition != self.last_partition:
            topic = self.fast.get((<bytes>RK.topic_name(m.rkt)).decode())
            if topic is None:
                return False
            key = self.keys.get((topic, m.partition))
            if key is None:
                key = self.keys[(topic, m.partition)] = (topic, m.partition)
            found = self.remaining.get(key)
            self.last_topic, self.last_partition, self.last_key = m.rkt, m.partition, key
            self.last_kind = 0 if topic == "history" else 1 if topic == "results" else 2 if topic == "balances" else -1
            self.last_until = -1 if found is None else found
        if m.offset >= self.last_until:
            return True  # past its end offset (bulk.load skips it too)
        if m.payload == NULL or m.len < 10 or self.last_kind < 0:
            return False
        c.b = <const unsigned char*>m.payload
        c.n = <Py_ssize_t>m.len
        c.p = 10
        c.bad = False
        if self.last_kind == 0:
            return memcmp(c.b, self.history_header, 10) == 0 and self._history(&c, self.last_key, m.offset)
        if self.last_kind == 1:
            return memcmp(c.b, self.result_header, 10) == 0 and self._result(&c, self.last_key, m.offset)
        return memcmp(c.b, self.balance_header, 10) == 0 and self._balance(&c, None, self.last_key, m.offset)

    cdef inline void _taken(self, object key, int64_t offset):
        self.offsets[key] = offset + 1
        self.applied += 1

    cdef bint _history(self, Cursor* c, object key, int64_t offset) except -1:
        cdef HistoryFields f
        cdef int64_t seq, occurred, at, value, last_seq, total, tail_seq, tail_occurred, tail_at
        cdef list state, ranges, last
        cdef tuple tail
        if c.n - 10 > 0x7FFFFFFF:
            return False  # its length would not fit where it is kept (_defer): the Python loop's
        _history_fields(c, &f)
        if (c.bad or c.p != c.n or not _integer(f.amount, &value) or not _integer(f.posted_after, &total)
                or not _integer(f.held_after, &total)):
            return False  # (amounts that are not plain integers: the Python loop judges them, fold.unfoldable)
        seq, occurred, at = f.seq, f.occurred, f.at
        name = _str(f.account)
        state = self.seen.get(name)
        if state is None:
            total = value
            self._taken(key, offset)
            self.seen[name] = [[[seq, seq]], (seq, (occurred, seq), value, (at, seq))]
        else:
            ranges = state[0]
            last = ranges[len(ranges) - 1]
            last_seq = last[1]
            if seq <= last_seq or name in self.refold:
                return False  # a gap filled late, a re-emission, or an account refolded at the end
            tail = state[1]
            tail_seq = tail[0]
            tail_occurred = tail[1][0]
            tail_at = tail[3][0]
            found = tail[2]
            if (seq <= tail_seq or occurred < tail_occurred or (occurred == tail_occurred and seq < tail[1][1])
                    or at < tail_at or (at == tail_at and seq < tail[3][1])):
                return False  # back-dated: its folds are recomputed, the Python loop says so
            if not -0x7FFFFFFFFFFFFFFF <= found <= 0x7FFFFFFFFFFFFFFF:
                return False
            total = <int64_t>found
            if sq_add(total, value, <long long*>&total):
                return False
            self._taken(key, offset)
            if seq == last_seq + 1:
                last[1] = seq
            else:
                ranges.append([seq, seq])
            state[1] = (seq, (occurred, seq), total, (at, seq))
        self._defer(name, c, total)
        return True

    cdef int _defer(self, object name, Cursor* c, int64_t total) except -1:
        """Keep a history row taken until `flush`, which writes the rows in the table's key order. Into
        SQLite as they come (the log's order, accounts interleaved) each row lands on a random page of the
        table's B-tree; in key order each lands after the one before. Copied into PostgreSQL in key order,
        the table's rows are in the order of its primary key and of its two indexes by time, whose builds
        then sort input that is already sorted (docs/read-side.md measures both). The row is kept as the
        record's bytes after the header and its fold, in an arena, and read again at the flush."""
        cdef Py_ssize_t body = c.n - 10, need = self.used + 4 + body + 8
        cdef int32_t length = <int32_t>body
        cdef char* grown
        if self.kept_names is not None:  # (the parts would not include it, and the flush would drop it)
            raise RuntimeError("fastload: a history record taken while the kept rows are handed over in parts")
        if self.used and need > DEFER_BYTES:
            self._flush()  # bounded memory: a rebuild larger than this inserts in key-ordered runs
            need = 4 + body + 8
        if need > self.size:
            grown = <char*>PyMem_Realloc(self.arena, max(need, 2 * self.size, 1 << 20))
            if grown == NULL:
                raise MemoryError()
            self.arena = grown
            self.size = max(need, 2 * self.size, 1 << 20)
        rows = self.pending.get(name)
        if rows is None:
            rows = self.pending[name] = []
        (<list>rows).append(self.used)
        memcpy(self.arena + self.used, &length, 4)
        memcpy(self.arena + self.used + 4, c.b + 10, body)
        memcpy(self.arena + self.used + 4 + body, &total, 8)
        self.used += 4 + body + 8
        return 0

    cdef int _copy_history(self, HistoryFields* f, Text by_time, Py_ssize_t length) except -1:
        """The row bulk.history_row makes (HISTORY_COLUMNS), in COPY's binary format. Every text but by_time
        and the literals is in the record (length bytes), held_after twice."""
        cdef Out* o = &self.history_copy
        _reserve(o, 2 + 20 * 4 + 2 * length + 3 * 8 + by_time.n + 4)
        _put_fields(o, 20)
        _put_text(o, f.account)
        _put_int8(o, f.seq)
        _put_text(o, f.entry_id)
        _put_text(o, f.currency)
        _put_text(o, f.amount)
        _put_text(o, f.posted_after)
        _put_text(o, f.held_after)
        _put_text(o, f.transaction_id)
        _put_text(o, f.kind)
        _put_text(o, f.reference)
        _put_text(o, f.hold_id)
        _put_int8(o, f.occurred)
        _put_int8(o, f.at)
        _put_text(o, f.command_id)
        _put_text(o, f.client_id)
        _put_text(o, by_time)
        _put_text(o, f.held_after)
        _put_text(o, _literal("[]", 2))
        _put_text(o, _literal("{}", 2))
        _put_text(o, f.rate)
        return 0

    def flush(self):
        """Write the history rows kept so far in key order (account, then seq: each account's rows were
        taken in seq order): into SQLite, or for PostgreSQL into the stream `copies` hands over next, with
        the result rows kept, in the results table's key order. Before the share commits, refolds or builds
        its indexes."""
        self._open()
        self._flush()
        self._flush_results()

    cdef int _flush_results(self) except -1:
        """The result rows kept (PostgreSQL), sorted by the results table's key, onto the stream `copies`
        hands over: its primary key's build then sorts sorted input (docs/read-side.md)."""
        global _sorting
        cdef Py_ssize_t i
        cdef Span* span
        cdef void* mutex
        if self.result_count == 0:
            return 0
        _sorting = self.result_pending.b
        qsort(self.result_spans, self.result_count, sizeof(Span), _by_result_key)
        _sorting = NULL
        if self.db != NULL:
            mutex = SQ.db_mutex(self.db)
            SQ.mutex_enter(mutex)  # (as in _flush)
            try:
                for i in range(self.result_count):
                    self._insert_result(self.result_pending.b + self.result_spans[i].start)
            finally:
                SQ.mutex_leave(mutex)
            self.result_pending.n = 0
            self.result_count = 0
            return 0
        _reserve(&self.result_copy, self.result_pending.n)
        for i in range(self.result_count):
            span = &self.result_spans[i]
            memcpy(self.result_copy.b + self.result_copy.n, self.result_pending.b + span.start, span.length)
            self.result_copy.n += span.length
        self.result_pending.n = 0
        self.result_count = 0
        return 0

    cdef int _flush(self) except -1:
        cdef void* mutex
        if not self.pending:
            return 0
        if self.db == NULL:  # PostgreSQL's: no SQLite here (whose functions may not even be bound)
            self._write_kept(-1)
        else:
            # Every bind, step and reset takes the connection's (recursive) mutex; held here once, each of
            # them re-enters it without an atomic operation.
            mutex = SQ.db_mutex(self.db)
            SQ.mutex_enter(mutex)
            try:
                self._write_kept(-1)
            finally:
                SQ.mutex_leave(mutex)
        self.pending.clear()
        self.used = 0
        return 0

    cdef bint _write_kept(self, Py_ssize_t limit) except -1:
        """The rows kept, from where the last call stopped: into SQLite, or onto history_copy, stopping once
        it holds `limit` bytes (limit < 0: no bound). True when rows are left for the next call."""
        cdef HistoryFields f
        cdef Cursor c
        cdef int32_t length
        cdef int64_t total, at
        cdef char digits[24]
        cdef Text by_time
        cdef sqlite3_stmt* stmt = self.history
        cdef list places
        if self.kept_names is None:
            # Both databases compare these keys bytewise (PostgreSQL's columns are COLLATE "C"); the names
            # are ASCII, whose str order is the same
            self.kept_names = sorted(self.pending)
            self.kept_name = self.kept_row = 0
        while self.kept_name < len(self.kept_names):
            places = <list>self.pending[self.kept_names[self.kept_name]]
            while self.kept_row < len(places):
                if 0 <= limit <= self.history_copy.n:
                    return True
                at = places[self.kept_row]
                self.kept_row += 1
                memcpy(&length, self.arena + at, 4)
                memcpy(&total, self.arena + at + 4 + length, 8)
                c.b = <const unsigned char*>(self.arena + at + 4)
                c.n = length
                c.p = 0
                c.bad = False
                _history_fields(&c, &f)
                if c.bad or c.p != c.n:
                    raise RuntimeError("fastload: a kept history record no longer reads as it did")
                by_time.n = snprintf(digits, sizeof(digits), "%lld", <long long>total)
                by_time.s = digits
                if self.db == NULL:
                    self._copy_history(&f, by_time, <Py_ssize_t>length + 10)
                    continue
                self._bind(stmt, 1, f.account)
                self._bind_int(stmt, 2, f.seq)
                self._bind(stmt, 3, f.entry_id)
                self._bind(stmt, 4, f.currency)
                self._bind(stmt, 5, f.amount)
                self._bind(stmt, 6, f.posted_after)
                self._bind(stmt, 7, f.held_after)
                self._bind(stmt, 8, f.transaction_id)
                self._bind(stmt, 9, f.kind)
                self._bind(stmt, 10, f.reference)
                self._bind(stmt, 11, f.hold_id)
                self._bind_int(stmt, 12, f.occurred)
                self._bind_int(stmt, 13, f.at)
                self._bind(stmt, 14, f.command_id)
                self._bind(stmt, 15, f.client_id)
                self._bind(stmt, 16, by_time)
                self._bind(stmt, 17, f.held_after)
                sq_text(stmt, 18, "[]", 2)
                sq_text(stmt, 19, "{}", 2)
                self._bind(stmt, 20, f.rate)
                self._step(stmt)
            self.kept_name += 1
            self.kept_row = 0
        self.kept_names = None
        return False

    cdef bint _result(self, Cursor* c, object key, int64_t offset) except -1:
        cdef Text command_id, client_id, reason, detail, transaction_id
        cdef Out* o
        cdef Span* spans
        cdef int64_t outcome, at
        cdef bint duplicate
        command_id = _text(c)
        client_id = _text(c)
        outcome = _long(c)
        reason = _optional_text(c)
        detail = _text(c)
        if c.p >= c.n:
            return False
        duplicate = c.b[c.p] != 0
        c.p += 1
        transaction_id = _optional_text(c)
        at = _long(c)
        _empty_block(c)  # holds
        if c.bad or c.p != c.n or outcome < 0 or outcome > 1:
            return False
        if duplicate:
            self._taken(key, offset)  # answers an original decision that is earlier in the log
            return True
        client, command = _str(client_id), _str(command_id)
        h = PyObject_Hash((client, command))
        if h in self.result_keys:
            return False  # a retried result: kept aside and applied at the end, by the Python loop
        self._taken(key, offset)
        self.result_keys.add(h)
        # The row bulk.result_row makes (RESULT_COLUMNS), in COPY's binary format, kept until `flush` writes
        # the rows in the results table's key order (for SQLite too, from this form)
        o = &self.result_pending
        if o.n > DEFER_BYTES:
            self._flush_results()  # bounded memory: key-ordered runs
        if self.result_count == self.result_cap:
            spans = <Span*>PyMem_Realloc(self.result_spans, max(1024, 2 * self.result_cap) * sizeof(Span))
            if spans == NULL:
                raise MemoryError()
            self.result_spans = spans
            self.result_cap = max(1024, 2 * self.result_cap)
        self.result_spans[self.result_count].start = o.n
        _reserve(o, 2 + 8 * 4 + c.n + 8 + 8 + 2)
        _put_fields(o, 8)
        _put_text(o, client_id)
        _put_text(o, command_id)
        _put_text(o, _literal("accepted", 8) if outcome == 0 else _literal("rejected", 8))
        _put_text(o, reason)
        _put_text(o, detail)
        _put_text(o, transaction_id)
        _put_int8(o, at)
        _put_text(o, _literal("[]", 2))
        self.result_spans[self.result_count].length = o.n - self.result_spans[self.result_count].start
        self.result_count += 1
        return True

    cdef int _insert_result(self, const char* row) except -1:
        """A result row kept in COPY's format (_result made it: eight fields, text but at_ms) into SQLite."""
        cdef sqlite3_stmt* stmt = self.results
        cdef const char* p = row + 2
        cdef Text t
        cdef int i
        cdef int64_t at
        for i in range(1, 9):
            t.n = <int>_get32(p)
            t.s = p + 4
            p += 4
            if i == 7:  # at_ms, int8
                at = <int64_t>((<uint64_t>_get32(p) << 32) | _get32(p + 4))
                self._bind_int(stmt, 7, at)
                p += 8
                continue
            self._bind(stmt, i, t)
            if t.n > 0:
                p += t.n
        self._step(stmt)
        return 0

    cdef Py_ssize_t _handed_back(self, Py_ssize_t i) except -1:
        self._settle()  # the Python loop reads and writes `balances`: it finds them as if it had done all
        return i

    cdef int _settle(self) except -1:
        """Decode the latest balance record of each account taken since the last time into `balances`."""
        if not self.latest:
            return 0
        for account, (seq, data) in self.latest.items():
            v, end = self.balance_body(data, 10)
            if end != PyBytes_GET_SIZE(data) or v["seq"] != seq or v["account_id"] != account:
                raise AssertionError(f"fastload read a balance record of {account!r} otherwise than its decoder")
            self.balances[account] = v
        self.latest.clear()
        return 0

    cdef bint _balance(self, Cursor* c, object data, object key, int64_t offset) except -1:
        """data: the record's bytes object, None when it has none (drain): one is made if it is kept."""
        cdef Text account, posted, held, available
        cdef int64_t seq, value
        account = _text(c)
        _text(c)  # currency
        _text(c)  # status
        posted = _text(c)
        held = _text(c)
        available = _text(c)
        seq = _long(c)
        _optional_text(c)  # last_transaction_id
        _long(c)  # updated_at_ms
        _optional_text(c)  # account_type
        if (c.bad or c.p != c.n or not _integer(posted, &value) or not _integer(held, &value)
                or not _integer(available, &value)):
            return False  # (amounts that are not plain integers: the Python loop judges them, fold.unfoldable)
        self._taken(key, offset)
        name = _str(account)
        taken = self.latest.get(name)
        if taken is not None:
            if seq > <int64_t>taken[0]:
                self.latest[name] = (seq, data if data is not None else PyBytes_FromStringAndSize(<const char*>c.b, c.n))
            return True
        old = self.balances.get(name)
        if old is None or seq > old["seq"]:
            self.latest[name] = (seq, data if data is not None else PyBytes_FromStringAndSize(<const char*>c.b, c.n))
        return True
