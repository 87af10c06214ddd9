/* tidemq.store._dispatch: the compiled parts of dispatch.
 *
 * - `scan_into`: the record walk of `scan.scan`;
 * - `index_append`: `IndexFile.append`'s writing of entries and slot chains;
 * - `java_hash`: Java's String.hashCode of one str (tags codes, key hashes one at a time);
 * - `write_runs`: `BatchBuilder._write_groups`'s copying of queues' runs of units into their files,
 *   with a `RunCache` of the files' mappings;
 * - `back_pages`: disk blocks allocated behind pages of a shared file mapping before they are
 *   written (`blocks.back_with_blocks`), as `write_runs` has them for every copy;
 * - `crc_prefix`: recovery's check of records' body CRCs (`recover._crc_prefix`);
 * - `RowIndex`: the dispatch thread's frontier-table rows by queue, and the commit of a batch's
 *   runs of slots that start at their queues' frontiers (`dispatch.commit.QueueCommitter`).
 *
 * Each has a Python or NumPy twin used where the extension is not built; tests compare the two.
 *
 * `scan_into(buf, start, stop, soft_stop, base_offset, wide, narrow)` walks the TOTALSIZE chain of
 * `buf` from `start` (a record boundary) exactly as scan.py's NumPy path does, with the same checks
 * (those of `record.decode(..., check_crc=False)`, PHYSICALOFFSET included), and fills one column
 * row per record.  `wide` is a C-contiguous int64 array of shape (10, capacity), `narrow` an int32
 * array of shape (5, capacity):
 *
 *   wide[0] position in buf    wide[1] QUEUEOFFSET        wide[2] STORETIMESTAMP
 *   wide[3] TAGS code          wide[4] properties start   wide[5] properties end (= record end)
 *   wide[6..7] [first, last) of the UNIQ_KEY value, wide[8..9] of the KEYS value, or -1
 *   narrow[0] TOTALSIZE        narrow[1] QUEUEID          narrow[2] SYSFLAG
 *   narrow[3] topic id (equal ids for equal topic bytes, numbered in order of first appearance)
 *   narrow[4] 1 if the TAGS code is final, 0 if the value holds non-ASCII bytes (the caller hashes
 *             the decoded text: Java's hash runs over UTF-16 units)
 *
 * Properties are `name \x01 value \x02 ...`: segments split on \x02, a segment's name runs to its
 * first \x01, and the last segment of a name wins (record.decode_properties).
 *
 * Returns (count, end, topics): the rows filled, the buffer position where the walk stopped (the
 * end of the last record taken, or `start`), and the distinct topics' raw bytes by id; with a true
 * eighth argument `keys`, (count, end, topics, (hashes, rows, slow)): the key index's entries for
 * the rows, hashed as the walk reads each record's properties (for each record that is not a
 * ROLLBACK, its UNIQ_KEY, then each non-empty space-separated KEYS entry, then its non-empty TAGS
 * value as the key "T#tag"): `hashes` (int32) and `rows` (int64, the record of each entry) as
 * bytes, and `slow` listing as (entry, row, first, last) the keys to hash from their decoded text
 * (their or their topic's bytes not all ASCII: hash 0 meanwhile), with `last` as -1 - last for a
 * tag's "T#tag" key.  A record is
 * taken only if it starts before `soft_stop` and before stop - 90, ends at or before `stop`, and
 * passes every check; the walk stops at the first that does not, or when `capacity` rows are full.
 * Topic bytes are not decoded here: the caller cuts the rows at the first topic that is not UTF-8.
 *
 * A long walk or append runs without the GIL (the buffers stay exported for its duration).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define MIN_RECORD_SIZE 91
#define HEADER_SIZE_V4 88
#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define FLAG_BORNHOST_V6 0x10
#define FLAG_STOREHOST_V6 0x20
/* Below these sizes the work keeps the GIL: in the store process the dispatch thread shares it
   with the event loop, and taking it back costs more than a trickle's walk or append. */
#define RELEASE_GIL_BYTES (256 << 10)
#define RELEASE_GIL_ENTRIES 8192
#define WIDE_COLUMNS 10
#define NARROW_COLUMNS 5

static const char NAME_TAGS[] = "TAGS";
static const char NAME_KEYS[] = "KEYS";
static const char NAME_UNIQ_KEY[] = "UNIQ_KEY";
/* the name older stores wrote the client message id under: read as UNIQ_KEY unless one is there */
static const char NAME_LEGACY_UNIQ_KEY[] = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX";

static inline int32_t get32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

static inline int64_t get64(const unsigned char *p) {
    return (int64_t)(((uint64_t)(uint32_t)get32(p) << 32) | (uint64_t)(uint32_t)get32(p + 4));
}

/* The distinct topics of one scan: ids in order of first appearance, found by an open-addressing
   table of FNV-1a hashes of the bytes. */
typedef struct {
    Py_ssize_t *at;    /* per id: position of its bytes in the buffer */
    Py_ssize_t *len;   /* per id: their length */
    int32_t *slots;    /* id + 1, or 0 for an empty slot */
    uint32_t *hashes;  /* per id */
    uint32_t *prefixes;  /* per id: Java hash of "topic#" for the key index (when ASCII) */
    unsigned char *ascii;  /* per id: 1 if every byte is ASCII */
    Py_ssize_t count, capacity, mask;
} TopicTable;

static uint32_t fnv1a(const unsigned char *p, Py_ssize_t n) {
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

static int table_init(TopicTable *t) {
    t->count = 0;
    t->capacity = 16;
    t->mask = 63;
    t->at = malloc(t->capacity * sizeof(Py_ssize_t));
    t->len = malloc(t->capacity * sizeof(Py_ssize_t));
    t->hashes = malloc(t->capacity * sizeof(uint32_t));
    t->prefixes = malloc(t->capacity * sizeof(uint32_t));
    t->ascii = malloc(t->capacity);
    t->slots = calloc(t->mask + 1, sizeof(int32_t));
    return t->at && t->len && t->hashes && t->prefixes && t->ascii && t->slots ? 0 : -1;
}

static void table_free(TopicTable *t) {
    free(t->at);
    free(t->len);
    free(t->hashes);
    free(t->prefixes);
    free(t->ascii);
    free(t->slots);
}

/* realloc(*array, bytes) into *array, which is left as it was on failure (-1).  Plain malloc
   memory: the walk grows its arrays without the GIL. */
static int resize(void **array, size_t bytes) {
    void *resized = realloc(*array, bytes);
    if (!resized) return -1;
    *array = resized;
    return 0;
}

/* Slots hold at most a quarter of their number of ids: grow both when the id arrays are full. */
static int table_grow(TopicTable *t) {
    Py_ssize_t capacity = t->capacity * 2, mask = t->mask * 2 + 1;
    if (resize((void **)&t->at, capacity * sizeof(Py_ssize_t)) < 0 || resize((void **)&t->len, capacity * sizeof(Py_ssize_t)) < 0 ||
        resize((void **)&t->hashes, capacity * sizeof(uint32_t)) < 0 || resize((void **)&t->prefixes, capacity * sizeof(uint32_t)) < 0 ||
        resize((void **)&t->ascii, capacity) < 0)
        return -1;
    int32_t *slots = calloc(mask + 1, sizeof(int32_t));
    if (!slots) return -1;
    for (Py_ssize_t id = 0; id < t->count; id++) {
        Py_ssize_t s = t->hashes[id] & mask;
        while (slots[s]) s = (s + 1) & mask;
        slots[s] = (int32_t)(id + 1);
    }
    free(t->slots);
    t->slots = slots;
    t->capacity = capacity;
    t->mask = mask;
    return 0;
}

/* The id of the topic bytes buf[at:at + n], added if new; -1 if out of memory. */
static Py_ssize_t table_id(TopicTable *t, const unsigned char *buf, Py_ssize_t at, Py_ssize_t n) {
    uint32_t h = fnv1a(buf + at, n);
    Py_ssize_t s = h & t->mask;
    while (t->slots[s]) {
        Py_ssize_t id = t->slots[s] - 1;
        if (t->hashes[id] == h && t->len[id] == n && memcmp(buf + t->at[id], buf + at, n) == 0) return id;
        s = (s + 1) & t->mask;
    }
    if (t->count == t->capacity) {
        if (table_grow(t) < 0) return -1;
        s = h & t->mask;
        while (t->slots[s]) s = (s + 1) & t->mask;
    }
    Py_ssize_t id = t->count++;
    t->at[id] = at;
    t->len[id] = n;
    t->hashes[id] = h;
    uint32_t prefix = 0;
    unsigned char ascii = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        ascii &= buf[at + i] < 0x80;
        prefix = prefix * 31u + buf[at + i];
    }
    t->prefixes[id] = prefix * 31u + '#';
    t->ascii[id] = ascii;
    t->slots[s] = (int32_t)(id + 1);
    return id;
}

static inline int is_name(const unsigned char *p, Py_ssize_t n, const char *name, Py_ssize_t name_len) {
    return n == name_len && memcmp(p, name, n) == 0;
}

/* The value ranges of TAGS, UNIQ_KEY and KEYS in the properties buf[first:last]: ranges[0..5]
   (a legacy-named UNIQ_KEY where the record has no UNIQ_KEY). */
static void find_properties(const unsigned char *buf, Py_ssize_t first, Py_ssize_t last, int64_t *ranges) {
    int64_t legacy_first = -1, legacy_last = -1;
    for (int i = 0; i < 6; i++) ranges[i] = -1;
    Py_ssize_t s = first;
    while (s < last) {
        const unsigned char *sep = memchr(buf + s, 2, last - s);
        Py_ssize_t segment_end = sep ? sep - buf : last;
        const unsigned char *eq = memchr(buf + s, 1, segment_end - s);
        if (eq) {
            Py_ssize_t name_len = eq - (buf + s), value = eq - buf + 1;
            int slot = -1;
            if (is_name(buf + s, name_len, NAME_TAGS, sizeof(NAME_TAGS) - 1)) slot = 0;
            else if (is_name(buf + s, name_len, NAME_UNIQ_KEY, sizeof(NAME_UNIQ_KEY) - 1)) slot = 2;
            else if (is_name(buf + s, name_len, NAME_KEYS, sizeof(NAME_KEYS) - 1)) slot = 4;
            else if (is_name(buf + s, name_len, NAME_LEGACY_UNIQ_KEY, sizeof(NAME_LEGACY_UNIQ_KEY) - 1)) {
                legacy_first = value;
                legacy_last = segment_end;
            }
            if (slot >= 0) {
                ranges[slot] = value;
                ranges[slot + 1] = segment_end;
            }
        }
        s = segment_end + 1;
    }
    if (ranges[2] < 0) {
        ranges[2] = legacy_first;
        ranges[3] = legacy_last;
    }
}

/* One key's entry: abs(Java hash of "topic#key") as IndexFile keeps it (Integer.MIN_VALUE as 0),
   from the topic's prefix hash (of "topic#") and the key's bytes; -1 if a byte is not ASCII. */
static int64_t key_entry_hash(uint32_t prefix, const unsigned char *p, Py_ssize_t n) {
    uint32_t h = prefix;
    Py_ssize_t i = 0;
    /* eight bytes a step, h * 31^8 + p[0] * 31^7 + ... + p[7] (mod 2^32): the products do not
       wait for each other, where a byte at a time waits for each multiply (3 times faster on a
       32-character UNIQ_KEY) */
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, p + i, 8);
        if (word & 0x8080808080808080ull) return -1;
        const unsigned char *q = p + i;
        h = h * 2487512833u + q[0] * 1742810335u + q[1] * 887503681u + q[2] * 28629151u + q[3] * 923521u +
            q[4] * 29791u + q[5] * 961u + q[6] * 31u + q[7];
    }
    for (; i < n; i++) {
        if (p[i] >= 0x80) return -1;
        h = h * 31u + p[i];
    }
    int32_t v = (int32_t)h;
    return v == INT32_MIN ? 0 : (v < 0 ? -(int64_t)v : v);
}

/* The key index's entries of a run of rows, in order, as they are found; `slow` holds
   (entry, row, first, last) for each key the caller hashes from its decoded text (it or its
   topic is not ASCII: its entry has hash 0 meanwhile).  Plain malloc: the walk fills it without
   the GIL. */
typedef struct {
    int32_t *hashes;
    int64_t *rows;
    Py_ssize_t count, capacity;
    Py_ssize_t *slow;
    Py_ssize_t slow_count, slow_capacity;
} Entries;

static void entries_free(Entries *e) {
    free(e->hashes);
    free(e->rows);
    free(e->slow);
}

/* `tag`: the key is "T#" + the bytes (the slow entry's last is then -1 - last) */
static int add_key(Entries *e, uint32_t prefix, int ascii_topic, const unsigned char *buf, Py_ssize_t row, Py_ssize_t first,
                   Py_ssize_t last, int tag) {
    if (e->count == e->capacity) {
        Py_ssize_t capacity = e->capacity ? e->capacity * 2 : 1024;
        if (resize((void **)&e->hashes, capacity * sizeof(int32_t)) < 0 || resize((void **)&e->rows, capacity * sizeof(int64_t)) < 0)
            return -1;
        e->capacity = capacity;
    }
    int64_t hash = ascii_topic ? key_entry_hash(prefix, buf + first, last - first) : -1;
    if (hash < 0) {
        if (e->slow_count + 4 > e->slow_capacity) {
            Py_ssize_t capacity = e->slow_capacity ? e->slow_capacity * 2 : 64;
            if (resize((void **)&e->slow, capacity * sizeof(Py_ssize_t)) < 0) return -1;
            e->slow_capacity = capacity;
        }
        Py_ssize_t *quad = e->slow + e->slow_count;
        quad[0] = e->count;
        quad[1] = row;
        quad[2] = first;
        quad[3] = tag ? -1 - last : last;
        e->slow_count += 4;
        hash = 0;
    }
    e->hashes[e->count] = (int32_t)hash;
    e->rows[e->count++] = row;
    return 0;
}

/* One record's entries: its UNIQ_KEY, then each non-empty space-separated KEYS entry, then its
   TAGS value as "T#tag" if not empty, unless it is a ROLLBACK.  `ranges` are [first, last) of the
   TAGS, UNIQ_KEY and KEYS values, or -1. */
static int record_keys(Entries *e, const unsigned char *buf, Py_ssize_t row, int32_t sysflag, uint32_t prefix, int ascii_topic,
                       const int64_t *ranges) {
    if ((sysflag & 0xC) == 0xC) return 0;  /* a ROLLBACK is not indexed */
    Py_ssize_t uniq_first = ranges[2], uniq_last = ranges[3], keys_first = ranges[4], keys_last = ranges[5];
    if (uniq_first >= 0 && uniq_last > uniq_first && add_key(e, prefix, ascii_topic, buf, row, uniq_first, uniq_last, 0) < 0)
        return -1;
    if (keys_first >= 0) {
        Py_ssize_t at = keys_first;
        while (at < keys_last) {
            while (at < keys_last && buf[at] == ' ') at++;
            Py_ssize_t token = at;
            while (at < keys_last && buf[at] != ' ') at++;
            if (at > token && add_key(e, prefix, ascii_topic, buf, row, token, at, 0) < 0) return -1;
        }
    }
    /* "topic#T#tag": the prefix hash of "topic#" carried over "T#" */
    if (ranges[0] >= 0 && ranges[1] > ranges[0] &&
        add_key(e, (prefix * 31u + 'T') * 31u + '#', ascii_topic, buf, row, ranges[0], ranges[1], 1) < 0)
        return -1;
    return 0;
}

/* (hashes, rows, slow): the entries as bytes (int32, int64) and the slow keys as a list of
   (entry, row, first, last); NULL with an exception set on failure. */
static PyObject *entries_result(Entries *e) {
    PyObject *slow = PyList_New(e->slow_count / 4);
    if (!slow) return NULL;
    for (Py_ssize_t i = 0; i < e->slow_count / 4; i++) {
        Py_ssize_t *quad = e->slow + 4 * i;
        PyObject *item = Py_BuildValue("nnnn", quad[0], quad[1], quad[2], quad[3]);
        if (!item) {
            Py_DECREF(slow);
            return NULL;
        }
        PyList_SET_ITEM(slow, i, item);
    }
    /* y# makes None of a NULL pointer: no entries are empty bytes */
    return Py_BuildValue("y#y#N", e->count ? (const char *)e->hashes : "", e->count * (Py_ssize_t)sizeof(int32_t),
                         e->count ? (const char *)e->rows : "", e->count * (Py_ssize_t)sizeof(int64_t), slow);
}

typedef struct {
    const unsigned char *buf;
    Py_ssize_t start, stop, soft_stop, capacity;
    int64_t base_offset;
    int64_t *wide;
    int32_t *narrow;
    TopicTable topics;
    int keys;  /* make the key index's entries too */
    Entries entries;
    Py_ssize_t count, end;
    int failed;  /* out of memory */
} Walk;

static void walk(Walk *w) {
    const unsigned char *buf = w->buf;
    Py_ssize_t cap = w->capacity, pos = w->start, stop = w->stop;
    Py_ssize_t limit = stop - MIN_RECORD_SIZE + 1;
    if (w->soft_stop < limit) limit = w->soft_stop;
    int64_t *positions = w->wide, *queue_offsets = w->wide + cap, *timestamps = w->wide + 2 * cap,
            *codes = w->wide + 3 * cap, *props = w->wide + 4 * cap, *ends = w->wide + 5 * cap,
            *key_ranges = w->wide + 6 * cap;
    int32_t *sizes = w->narrow, *queue_ids = w->narrow + cap, *sysflags = w->narrow + 2 * cap,
            *topic_ids = w->narrow + 3 * cap, *final_codes = w->narrow + 4 * cap;
    Py_ssize_t n = 0, last_topic_at = -1, last_topic_len = -1, last_topic_id = -1;
    while (pos < limit && n < cap) {
        const unsigned char *r = buf + pos;
        int32_t size = get32(r);
        if (size < MIN_RECORD_SIZE || pos + size > stop) break;
        Py_ssize_t end = pos + size;
        int32_t magic = get32(r + 4), sysflag = get32(r + 36);
        int v2 = magic == MAGIC_V2;
        Py_ssize_t header = HEADER_SIZE_V4 + ((sysflag & FLAG_BORNHOST_V6) ? 12 : 0) + ((sysflag & FLAG_STOREHOST_V6) ? 12 : 0);
        if (!(v2 || magic == MAGIC_V1) || header + 3 > size || get64(r + 28) != (int64_t)pos + w->base_offset) break;
        int32_t body_length = get32(r + header - 4);
        if (body_length < 0) break;
        Py_ssize_t topic_length_at = pos + header + body_length;
        if (topic_length_at + 1 + v2 > end) break;
        Py_ssize_t topic_length = v2 ? (int16_t)((buf[topic_length_at] << 8) | buf[topic_length_at + 1]) : buf[topic_length_at];
        Py_ssize_t topic_at = topic_length_at + 1 + v2, properties_at = topic_at + topic_length + 2;
        if (topic_length < 0 || properties_at > end) break;
        Py_ssize_t properties_length = (int16_t)((buf[properties_at - 2] << 8) | buf[properties_at - 1]);
        if (properties_length < 0 || properties_at + properties_length != end) break;
        Py_ssize_t topic_id;
        if (topic_length == last_topic_len && memcmp(buf + topic_at, buf + last_topic_at, topic_length) == 0) {
            topic_id = last_topic_id;
        } else {
            topic_id = table_id(&w->topics, buf, topic_at, topic_length);
            if (topic_id < 0) {
                w->failed = 1;
                break;
            }
            last_topic_at = topic_at;
            last_topic_len = topic_length;
            last_topic_id = topic_id;
        }
        int64_t ranges[6];
        find_properties(buf, properties_at, end, ranges);
        uint32_t hash = 0;
        int32_t final = 1;
        for (int64_t i = ranges[0]; i < ranges[1]; i++) {
            if (buf[i] >= 0x80) final = 0;
            hash = hash * 31u + buf[i];
        }
        positions[n] = pos;
        queue_offsets[n] = get64(r + 20);
        timestamps[n] = get64(r + ((sysflag & FLAG_BORNHOST_V6) ? 68 : 56));
        codes[n] = ranges[0] >= 0 ? (int64_t)(int32_t)hash : 0;
        props[n] = properties_at;
        ends[n] = end;
        for (int k = 0; k < 4; k++) key_ranges[k * cap + n] = ranges[2 + k];
        /* hashed here, the bytes just read, rather than read again by a second pass */
        if (w->keys && record_keys(&w->entries, buf, n, sysflag, w->topics.prefixes[topic_id], w->topics.ascii[topic_id], ranges) < 0) {
            w->failed = 1;
            break;
        }
        sizes[n] = size;
        queue_ids[n] = get32(r + 12);
        sysflags[n] = sysflag;
        topic_ids[n] = (int32_t)topic_id;
        final_codes[n] = final;
        n++;
        pos = end;
    }
    w->count = n;
    w->end = pos;
}

static int writable_column_block(Py_buffer *view, Py_ssize_t rows, Py_ssize_t itemsize, const char *name) {
    if (!PyBuffer_IsContiguous(view, 'C') || view->itemsize != itemsize || view->len % (rows * itemsize) != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous array of %zd-byte items with %zd rows", name, itemsize, rows);
        return -1;
    }
    return 0;
}

static PyObject *scan_into(PyObject *self, PyObject *args) {
    Py_buffer data, wide, narrow;
    Py_ssize_t start, stop, soft_stop;
    long long base_offset;
    int keys = 0;
    if (!PyArg_ParseTuple(args, "y*nnnLw*w*|p", &data, &start, &stop, &soft_stop, &base_offset, &wide, &narrow, &keys)) return NULL;
    PyObject *result = NULL;
    Walk w = {0};
    w.keys = keys;
    if (writable_column_block(&wide, WIDE_COLUMNS, 8, "wide") < 0 || writable_column_block(&narrow, NARROW_COLUMNS, 4, "narrow") < 0)
        goto done;
    w.capacity = wide.len / (WIDE_COLUMNS * 8);
    if (narrow.len / (NARROW_COLUMNS * 4) != w.capacity) {
        PyErr_SetString(PyExc_ValueError, "wide and narrow must have the same capacity");
        goto done;
    }
    if (start < 0 || stop > data.len || start > stop) {
        PyErr_Format(PyExc_ValueError, "range [%zd, %zd) is not within the buffer of %zd bytes", start, stop, data.len);
        goto done;
    }
    if (table_init(&w.topics) < 0) {
        table_free(&w.topics);
        PyErr_NoMemory();
        goto done;
    }
    w.buf = data.buf;
    w.start = start;
    w.stop = stop;
    w.soft_stop = soft_stop;
    w.base_offset = base_offset;
    w.wide = wide.buf;
    w.narrow = narrow.buf;
    if (stop - start >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        walk(&w);
        Py_END_ALLOW_THREADS
    } else {
        walk(&w);
    }
    if (w.failed) {
        PyErr_NoMemory();
    } else {
        PyObject *topics = PyList_New(w.topics.count);
        if (topics) {
            for (Py_ssize_t id = 0; id < w.topics.count; id++) {
                PyObject *raw = PyBytes_FromStringAndSize((const char *)w.buf + w.topics.at[id], w.topics.len[id]);
                if (!raw) {
                    Py_CLEAR(topics);
                    break;
                }
                PyList_SET_ITEM(topics, id, raw);
            }
        }
        if (topics && keys) {
            PyObject *entries = entries_result(&w.entries);
            result = entries ? Py_BuildValue("nnNN", w.count, w.end, topics, entries) : NULL;
            if (!entries) Py_DECREF(topics);
        } else if (topics) {
            result = Py_BuildValue("nnN", w.count, w.end, topics);
        }
    }
    table_free(&w.topics);
    entries_free(&w.entries);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&wide);
    PyBuffer_Release(&narrow);
    return result;
}

static int column(Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t rows, const char *name) {
    if (!PyBuffer_IsContiguous(view, 'C') || view->len != rows * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must be a contiguous column of %zd %zd-byte items", name, rows, itemsize);
        return -1;
    }
    return 0;
}

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

/* Sort `n` packed (slot << 32 | row) keys ascending by slot, rows in order within a slot (LSD
   radix sort on the slot's bits, 12 a pass); `spare` has room for n.  The sorted keys are in the
   array returned (one of the two). */
static uint64_t *sort_by_slot(uint64_t *keys, uint64_t *spare, Py_ssize_t n, int64_t hash_slots) {
    int bits = 0;
    while (bits < 32 && ((int64_t)1 << bits) < hash_slots) bits++;
    Py_ssize_t counts[4096];
    for (int shift = 32; shift < 32 + bits; shift += 12) {
        memset(counts, 0, sizeof counts);
        for (Py_ssize_t i = 0; i < n; i++) counts[(keys[i] >> shift) & 4095]++;
        Py_ssize_t at = 0;
        for (int d = 0; d < 4096; d++) {
            Py_ssize_t c = counts[d];
            counts[d] = at;
            at += c;
        }
        for (Py_ssize_t i = 0; i < n; i++) spare[counts[(keys[i] >> shift) & 4095]++] = keys[i];
        uint64_t *t = keys;
        keys = spare;
        spare = t;
    }
    return keys;
}

/* index_append(mm, hash_slots, max_entries, count, hashes, phys, timestamps, begin_timestamp) ->
   None: IndexFile's entries count .. count + n - 1 (spec §7: 40-byte header, hash_slots 4-byte
   slots, 20-byte entries hash i32 | phy i64 | time_diff i32 | prev i32, big-endian) for n keys
   (int64 columns, n <= max_entries - count), each linked to the entry its slot held and made
   the slot's head.  A slot's head is followed if it is a counted entry (0 < head < count) or
   an entry this call wrote for the same slot; anything else (a crash's leftovers past count)
   starts a new chain.  time_diff is (timestamp - begin_timestamp) // 1000 clipped to
   [0, INT_MAX], 0 without a begin timestamp.  The header is the caller's.
   Two passes: the chains first, over the keys sorted by slot (a stable radix sort, rows in log
   order within a slot, as the NumPy twin links them), so that the slots are read and written in
   address order, not at random (the bench's 4 MB of slots outgrow a core's cache); then the
   entries, in log order, reading the columns in order (one pass in either order reads one of
   the two at random). */
static PyObject *index_append(PyObject *self, PyObject *args) {
    Py_buffer mm, hv, pv, tv;
    Py_ssize_t hash_slots, max_entries, count;
    long long begin_timestamp;
    if (!PyArg_ParseTuple(args, "w*nnny*y*y*L", &mm, &hash_slots, &max_entries, &count, &hv, &pv, &tv, &begin_timestamp))
        return NULL;
    PyObject *result = NULL;
    uint64_t *keys = NULL, *spare = NULL;
    Py_ssize_t n = hv.len / 8;
    Py_ssize_t entries_at = 40 + hash_slots * 4;
    if (column(&hv, 8, n, "hashes") < 0 || column(&pv, 8, n, "phys") < 0 || column(&tv, 8, n, "timestamps") < 0) goto done;
    if (hash_slots <= 0 || count < 1 || count + n > max_entries || entries_at + max_entries * 20 > mm.len) {
        PyErr_Format(PyExc_ValueError, "%zd entries from %zd do not fit an index file of %zd slots and %zd entries (%zd bytes)",
                     n, count, hash_slots, max_entries, mm.len);
        goto done;
    }
    unsigned char *base = mm.buf, *slots = base + 40, *entries = base + entries_at;
    const int64_t *hashes = hv.buf, *phys = pv.buf, *timestamps = tv.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (hashes[i] < 0 || hashes[i] > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "key hash %lld is not an index file's (0 .. 2**31 - 1)", (long long)hashes[i]);
            goto done;
        }
    }
    keys = PyMem_RawMalloc((n ? n : 1) * sizeof(uint64_t));
    spare = PyMem_RawMalloc((n ? n : 1) * sizeof(uint64_t));
    if (keys == NULL || spare == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyThreadState *released = n >= RELEASE_GIL_ENTRIES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) keys[i] = (uint64_t)(hashes[i] % hash_slots) << 32 | (uint64_t)i;
    const uint64_t *sorted = sort_by_slot(keys, spare, n, hash_slots);
    /* each key's predecessor in its slot's chain, by the keys in slot order, into `spare` as
       uint32 (the array the sort left free): the slots are read and written in address order */
    uint32_t *previous = (uint32_t *)(sorted == keys ? spare : keys);
    int64_t slot = -1, head = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t key_slot = (int64_t)(sorted[k] >> 32);
        Py_ssize_t i = (Py_ssize_t)(sorted[k] & 0xFFFFFFFFu);
        if (key_slot != slot) {
            if (slot >= 0) put32(slots + slot * 4, (uint32_t)head);
            slot = key_slot;
            head = get32(slots + slot * 4);
            if (!(head > 0 && head < count)) head = 0;  /* this call has written none of its keys yet */
        }
        previous[i] = (uint32_t)head;
        head = count + i;
    }
    if (slot >= 0) put32(slots + slot * 4, (uint32_t)head);
    /* then the entries, in log order */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t diff = 0;
        if (begin_timestamp > 0 && timestamps[i] > begin_timestamp) {
            diff = (timestamps[i] - begin_timestamp) / 1000;
            if (diff > INT32_MAX) diff = INT32_MAX;
        }
        unsigned char *e = entries + (count + i) * 20;
        put32(e, (uint32_t)hashes[i]);
        put32(e + 4, (uint32_t)((uint64_t)phys[i] >> 32));
        put32(e + 8, (uint32_t)phys[i]);
        put32(e + 12, (uint32_t)diff);
        put32(e + 16, previous[i]);
    }
    if (released) PyEval_RestoreThread(released);
    result = Py_NewRef(Py_None);
done:
    PyMem_RawFree(keys);
    PyMem_RawFree(spare);
    PyBuffer_Release(&mm);
    PyBuffer_Release(&hv);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&tv);
    return result;
}

/* Disk blocks behind the pages of a shared file mapping, allocated before they are written: a
   page of a sparse file written through a mapping on a full disk ends the process with SIGBUS.
   `populate(data, from, to)` has the pages holding data[from, to) faulted in writable
   (MADV_POPULATE_WRITE), which allocates their blocks (or, on tmpfs, their memory): 0, or -1 with
   errno ENOSPC where the disk has none (the fault that would have been the SIGBUS) or another
   error.  Where the kernel lacks MADV_POPULATE_WRITE (EINVAL) nothing is done from then on. */
static int populate_works = 1;

static int populate(unsigned char *data, Py_ssize_t from, Py_ssize_t to) {
    if (!populate_works || to <= from) return 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = (uintptr_t)(data + from) & ~(page - 1);
    if (madvise((void *)first, (uintptr_t)(data + to) - first, MADV_POPULATE_WRITE) == 0) return 0;
    if (errno == EINVAL) {
        populate_works = 0;
        return 0;
    }
    if (errno == EFAULT) errno = ENOSPC;
    return -1;
}

/* OSError for a failed `populate` of a page of `what`. */
static void populate_error(const char *what) {
    int error = errno;
    char message[160];
    if (error == ENOSPC)
        snprintf(message, sizeof message, "no disk block for a page of %s: the store's disk is full", what);
    else
        snprintf(message, sizeof message, "%s (allocating a page of %s)", strerror(error), what);
    PyObject *args = Py_BuildValue("(is)", error, message);
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
}

/* back_pages(mapping, start, length): `populate` for mapping[start : start + length] (a writable
   buffer of a shared file mapping).  Raises OSError (ENOSPC on a full disk) having written
   nothing. */
static PyObject *back_pages(PyObject *self, PyObject *args) {
    Py_buffer mm;
    Py_ssize_t start, length;
    if (!PyArg_ParseTuple(args, "w*nn", &mm, &start, &length)) return NULL;
    if (start < 0 || length < 0 || start > mm.len) {
        PyErr_Format(PyExc_ValueError, "bytes %zd..+%zd do not lie in a %zd-byte mapping", start, length, mm.len);
        PyBuffer_Release(&mm);
        return NULL;
    }
    Py_ssize_t end = length > mm.len - start ? mm.len : start + length;
    int failed = populate(mm.buf, start, end);
    PyBuffer_Release(&mm);
    if (failed) {
        populate_error("a mapped store file");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A RunCache: the queue-file mappings write_runs has copied into, by (topic, queue id, first slot
   of the file), each with its buffer exported and its address at hand, so that a run into a file
   seen before costs a probe of one open-addressing table instead of making a key tuple (and an
   int or two) and looking it up in the builder's dict.  Topics are
   numbered by name (`topics`), so the numbers hold from one batch to the next whatever each
   batch's topic ids.  Only mappings that are in write_runs' `files` dict are cached: `clear()`
   releases them all, and the builder calls it before it closes them (a mapping with an exported
   buffer refuses to close), and then the topics are numbered anew. */
typedef struct {
    int64_t file_start; /* -1: an empty slot */
    int32_t topic, queue_id;
    unsigned char *data;
    Py_ssize_t len;
    Py_ssize_t backed_from, backed_to; /* bytes whose pages `populate` backed through this mapping */
} CacheSlot;

typedef struct {
    PyObject_HEAD
    CacheSlot *slots;
    Py_ssize_t mask;    /* slots - 1, a power of two less one; at most half the slots are taken */
    Py_buffer *views;   /* the exported buffers, in the order they were cached */
    Py_ssize_t count, room;
    PyObject *topics;   /* dict: topic name -> number, renumbered after each clear */
    uint64_t clears;
} RunCache;

static PyTypeObject RunCacheType;

static inline Py_ssize_t cache_hash(int32_t topic, int32_t queue_id, int64_t file_start, Py_ssize_t mask) {
    uint64_t h = ((uint64_t)(uint32_t)topic << 32 | (uint32_t)queue_id) * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)file_start * 0xC2B2AE3D27D4EB4Full;
    return (Py_ssize_t)((h ^ (h >> 29)) & (uint64_t)mask);
}

static CacheSlot *cache_find(RunCache *c, int32_t topic, int32_t queue_id, int64_t file_start) {
    for (Py_ssize_t s = cache_hash(topic, queue_id, file_start, c->mask);; s = (s + 1) & c->mask) {
        CacheSlot *slot = &c->slots[s];
        if (slot->file_start < 0) return slot; /* where it would go */
        if (slot->file_start == file_start && slot->queue_id == queue_id && slot->topic == topic) return slot;
    }
}

static int cache_alloc(RunCache *c, Py_ssize_t slots) {
    CacheSlot *table = PyMem_Malloc(slots * sizeof(CacheSlot));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < slots; s++) table[s].file_start = -1;
    CacheSlot *old = c->slots;
    Py_ssize_t old_mask = c->mask;
    c->slots = table;
    c->mask = slots - 1;
    if (old != NULL) {
        for (Py_ssize_t s = 0; s <= old_mask; s++)
            if (old[s].file_start >= 0) *cache_find(c, old[s].topic, old[s].queue_id, old[s].file_start) = old[s];
        PyMem_Free(old);
    }
    return 0;
}

/* Cache `mapping` (writable) as the file of (topic, queue id) from file_start; its slot, or NULL
   with an exception set. */
static CacheSlot *cache_add(RunCache *c, int32_t topic, int32_t queue_id, int64_t file_start, PyObject *mapping) {
    if ((c->count + 1) * 2 > c->mask + 1 && cache_alloc(c, (c->mask + 1) * 2) < 0) return NULL;
    if (c->count == c->room) {
        Py_ssize_t room = c->room ? c->room * 2 : 64;
        Py_buffer *views = PyMem_Realloc(c->views, room * sizeof(Py_buffer));
        if (views == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        c->views = views;
        c->room = room;
    }
    Py_buffer *view = &c->views[c->count];
    if (PyObject_GetBuffer(mapping, view, PyBUF_WRITABLE) < 0) return NULL;
    c->count++;
    CacheSlot *slot = cache_find(c, topic, queue_id, file_start);
    slot->file_start = file_start;
    slot->topic = topic;
    slot->queue_id = queue_id;
    slot->data = view->buf;
    slot->len = view->len;
    slot->backed_from = slot->backed_to = 0;
    return slot;
}

static void cache_release(RunCache *c) {
    for (Py_ssize_t i = 0; i < c->count; i++) PyBuffer_Release(&c->views[i]);
    c->count = 0;
    for (Py_ssize_t s = 0; s <= c->mask; s++) c->slots[s].file_start = -1;
    PyDict_Clear(c->topics);
    c->clears++;
}

static PyObject *run_cache_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "RunCache() takes no arguments");
        return NULL;
    }
    RunCache *c = (RunCache *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->topics = PyDict_New();
    if (c->topics == NULL || cache_alloc(c, 1024) < 0) {
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

static void run_cache_dealloc(RunCache *c) {
    if (c->slots != NULL) cache_release(c);
    PyMem_Free(c->slots);
    PyMem_Free(c->views);
    Py_XDECREF(c->topics);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *run_cache_clear(RunCache *c, PyObject *unused) {
    cache_release(c);
    Py_RETURN_NONE;
}

static Py_ssize_t run_cache_length(RunCache *c) { return c->count; }

static PyMethodDef run_cache_methods[] = {
    {"clear", (PyCFunction)run_cache_clear, METH_NOARGS, "Release every mapping cached (before closing them)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods run_cache_as_sequence = {.sq_length = (lenfunc)run_cache_length};

static PyTypeObject RunCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidemq.store._dispatch.RunCache",
    .tp_basicsize = sizeof(RunCache),
    .tp_dealloc = (destructor)run_cache_dealloc,
    .tp_as_sequence = &run_cache_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The queue-file mappings write_runs copies into, by topic, queue id and first slot (see the module source).",
    .tp_methods = run_cache_methods,
    .tp_new = run_cache_new,
};

/* `populate` for bytes [from, to) of the mapping `data` of `len` bytes, remembering in `slot` (a
   cached mapping's, or NULL) how far its pages are backed, so that a copy into pages backed before
   costs no system call: 0, or -1 as `populate`. */
static int back_copy(CacheSlot *slot, unsigned char *data, Py_ssize_t len, Py_ssize_t from, Py_ssize_t to) {
    if (slot != NULL && from >= slot->backed_from && to <= slot->backed_to) return 0;
    if (populate(data, from, to) < 0) return -1;
    if (slot != NULL) {
        Py_ssize_t page = (Py_ssize_t)sysconf(_SC_PAGESIZE);
        Py_ssize_t first = from - (Py_ssize_t)((uintptr_t)(data + from) & (uintptr_t)(page - 1));
        Py_ssize_t last = to + (page - (Py_ssize_t)((uintptr_t)(data + to) & (uintptr_t)(page - 1))) % page;
        if (last > len) last = len;
        if (slot->backed_to > slot->backed_from && first <= slot->backed_to && last >= slot->backed_from) {
            if (first < slot->backed_from) slot->backed_from = first;
            if (last > slot->backed_to) slot->backed_to = last;
        } else {
            slot->backed_from = first;
            slot->backed_to = last;
        }
    }
    return 0;
}

/* The cache's numbers for `names` into `numbers` (PyMem, allocated if NULL): 0, or -1 with an
   exception set. */
static int topic_numbers(RunCache *c, PyObject *names, int32_t **into) {
    Py_ssize_t n = PyList_GET_SIZE(names);
    int32_t *numbers = *into != NULL ? *into : PyMem_Malloc((n ? n : 1) * sizeof(int32_t));
    if (numbers == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *into = numbers;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        PyObject *number = PyDict_GetItemWithError(c->topics, name);
        if (number == NULL) {
            if (PyErr_Occurred() || (number = PyLong_FromSsize_t(PyDict_GET_SIZE(c->topics))) == NULL) return -1;
            int stored = PyDict_SetItem(c->topics, name, number);
            Py_DECREF(number);
            if (stored < 0) return -1;
        }
        numbers[i] = (int32_t)PyLong_AsLong(number);
    }
    return 0;
}

/* write_runs copies into cached mappings `COPIES_AT_ONCE` at a time, after looking up their
   targets, and looks up the cache slot of the run `SLOT_AHEAD` rows ahead first.  In a batch naming
   many queues each run goes into another file: its target page missed the TLB and its slot and
   target line the caches.  Copied as each was looked up, about 100 instructions apart, these
   misses were waited for one at a time; in a tight loop of copies the processor overlaps them.
   (A prefetch of each target some rows ahead does not help: it waits for its page walk as the
   copy does.) */
#define COPIES_AT_ONCE 32
#define SLOT_AHEAD 8
typedef struct {
    unsigned char *target;
    const unsigned char *units;
    size_t size;
} Copy;

static inline void copy_all(Copy *copies, int *pending) {
    for (int k = 0; k < *pending; k++) memcpy(copies[k].target, copies[k].units, copies[k].size);
    *pending = 0;
}

/* What one write_runs call works with. */
typedef struct {
    PyObject *files, *names, *open_file;
    RunCache *cache;   /* NULL: none */
    int32_t *numbers;  /* with a cache: its numbers for `names` */
} Runs;

/* The target of a copy into the file of (names[tid], queue id) from slot `file_start` that the
   cache does not hold: the mapping in `files`, or the one open_file makes (which may close the
   builder's mappings, clearing the cache: the topics are then numbered anew).  Cached when
   `files` keeps it; otherwise its buffer is exported into `view` for this copy alone.  1 with
   *target and *len set; 0 when open_file is or gave None (the row goes back to the caller); -1
   with an exception set. */
static int uncached_target(Runs *r, Py_ssize_t tid, PyObject *queue_id, int32_t queue_number, int64_t file_start,
                           Py_ssize_t upf, Py_buffer *view, unsigned char **target, Py_ssize_t *len) {
    PyObject *topic = PyList_GET_ITEM(r->names, tid);
    PyObject *start = PyLong_FromLongLong(file_start), *key = NULL, *mm = NULL;
    int found = -1;
    if (start == NULL || (key = PyTuple_Pack(3, topic, queue_id, start)) == NULL) goto done;
    mm = PyDict_GetItemWithError(r->files, key);
    if (mm != NULL) {
        Py_INCREF(mm);
    } else if (!PyErr_Occurred()) {
        if (r->open_file == Py_None) {  /* only files mapped already */
            found = 0;
            goto done;
        }
        uint64_t clears = r->cache != NULL ? r->cache->clears : 0;
        mm = PyObject_CallFunction(r->open_file, "OOOn", topic, queue_id, start, upf);
        if (mm != NULL && r->cache != NULL && r->cache->clears != clears && topic_numbers(r->cache, r->names, &r->numbers) < 0)
            Py_CLEAR(mm);
    }
    if (mm == NULL) goto done;
    if (mm == Py_None) {
        found = 0;
        goto done;
    }
    /* cached only if `files` keeps it (open_file may have cleared the cache: look again) */
    PyObject *kept = r->cache != NULL ? PyDict_GetItemWithError(r->files, key) : NULL;
    if (kept == mm) {
        CacheSlot *slot = cache_add(r->cache, r->numbers[tid], queue_number, file_start, mm);
        if (slot == NULL) goto done;
        *target = slot->data;
        *len = slot->len;
    } else {
        if (PyErr_Occurred() || PyObject_GetBuffer(mm, view, PyBUF_WRITABLE) < 0) goto done;
        *target = view->buf;
        *len = view->len;
    }
    found = 1;
done:
    Py_XDECREF(mm);
    Py_XDECREF(key);
    Py_XDECREF(start);
    return found;
}

/* write_runs(files, names, units_per_file, default_units_per_file, groups, units, open_file[, cache])
   -> list: ConsumeQueue units copied to their slots, one copy per queue file a run spans: the loop
   of `BatchBuilder._write_groups` over queues whose slots in the batch are one run.  `groups` holds
   int64 rows (topic id, queue id, first slot, start, stop): queue (names[topic id], queue id)
   gets units[start:stop] of `units` (20 bytes each) at its slots first .. first + stop - start - 1.
   A queue's files hold upf slots each, upf = units_per_file.get((topic, queue id),
   default_units_per_file); the one holding slot s is files[(topic, queue id, s - s % upf)], or,
   missing there, open_file(topic, queue id, s - s % upf, upf), which maps it (and may close and
   empty `files`, clearing `cache` first) or returns None: the rest of that row is skipped, as
   it is at once when open_file is None (the files in `files` only, no call per file).  Returns
   the skipped rows' numbers.  With a RunCache, a mapping found in `files` (or put there by
   open_file) is cached, and later runs into it look it up there; otherwise each mapping is held,
   and its buffer exported, only for its copy.  The pages a copy writes get their disk blocks
   first (`back_copy`): on a full disk it raises OSError (ENOSPC), the runs before that one
   written, none after (writing the same units again later is harmless: each has its slot). */
static PyObject *write_runs(PyObject *self, PyObject *args) {
    PyObject *files, *names, *upf_of, *open_file, *cache_obj = Py_None;
    Py_ssize_t default_upf;
    Py_buffer gv, uv;
    if (!PyArg_ParseTuple(args, "O!O!O!ny*y*O|O", &PyDict_Type, &files, &PyList_Type, &names, &PyDict_Type, &upf_of,
                          &default_upf, &gv, &uv, &open_file, &cache_obj))
        return NULL;
    PyObject *result = NULL, *queue_id = NULL, *skipped = PyList_New(0);
    Runs r = {files, names, open_file, NULL, NULL};
    Copy copies[COPIES_AT_ONCE];
    int pending = 0;
    if (skipped == NULL) goto done;
    if (cache_obj != Py_None) {
        if (!PyObject_TypeCheck(cache_obj, &RunCacheType)) {
            PyErr_Format(PyExc_TypeError, "write_runs' cache must be a RunCache or None, not %.100s", Py_TYPE(cache_obj)->tp_name);
            goto done;
        }
        r.cache = (RunCache *)cache_obj;
    }
    Py_ssize_t n = gv.len / 40, unit_count = uv.len / 20, name_count = PyList_GET_SIZE(names);
    if (column(&gv, 40, n, "groups") < 0 || column(&uv, 20, unit_count, "units") < 0) goto done;
    if (default_upf <= 0) {
        PyErr_Format(PyExc_ValueError, "units per file must be positive, not %zd", default_upf);
        goto done;
    }
    if (r.cache != NULL && topic_numbers(r.cache, names, &r.numbers) < 0) goto done;
    const int64_t *g = gv.buf;
    /* the slot prefetch assumes every queue has the default units per file */
    int prefetch = r.cache != NULL && !PyDict_GET_SIZE(upf_of);
    for (Py_ssize_t i = 0; i < n; i++, g += 5) {
        if (prefetch && i + SLOT_AHEAD < n) {
            const int64_t *ahead = g + 5 * SLOT_AHEAD;
            if (ahead[0] >= 0 && ahead[0] < name_count && ahead[2] >= 0)
                __builtin_prefetch(&r.cache->slots[cache_hash(r.numbers[ahead[0]], (int32_t)ahead[1], ahead[2] - ahead[2] % default_upf,
                                                              r.cache->mask)]);
        }
        int64_t tid = g[0], first = g[2], start = g[3], stop = g[4];
        if (tid < 0 || tid >= name_count || g[1] < INT32_MIN || g[1] > INT32_MAX || first < 0 || start < 0
            || stop < start || stop > unit_count) {
            PyErr_Format(PyExc_ValueError, "group %zd (topic id %lld, queue id %lld, first slot %lld, units %lld..%lld) "
                         "does not fit %zd topics and %zd units", i, (long long)tid, (long long)g[1], (long long)first,
                         (long long)start, (long long)stop, name_count, unit_count);
            goto done;
        }
        PyObject *topic = PyList_GET_ITEM(names, tid);
        Py_ssize_t upf = default_upf;
        if (PyDict_GET_SIZE(upf_of)) {
            if ((queue_id = PyLong_FromLongLong(g[1])) == NULL) goto done;
            PyObject *key = PyTuple_Pack(2, topic, queue_id);
            if (key == NULL) goto done;
            PyObject *value = PyDict_GetItemWithError(upf_of, key);
            Py_DECREF(key);
            if (value != NULL) {
                upf = PyLong_AsSsize_t(value);
                if (upf <= 0) {
                    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "units per file must be positive, not %zd", upf);
                    goto done;
                }
            } else if (PyErr_Occurred()) {
                goto done;
            }
        }
        for (int64_t done = start; done < stop;) {
            int64_t slot = first + done - start, file_start = slot - slot % upf;
            int64_t count = stop - done < file_start + upf - slot ? stop - done : file_start + upf - slot;
            Py_ssize_t pos = (Py_ssize_t)(slot - file_start) * 20;
            unsigned char *target = NULL;
            Py_ssize_t target_len = 0;
            CacheSlot *cached = r.cache != NULL ? cache_find(r.cache, r.numbers[tid], (int32_t)g[1], file_start) : NULL;
            Py_buffer view = {0};
            if (cached != NULL && cached->file_start >= 0) {
                target = cached->data;
                target_len = cached->len;
            } else {
                cached = NULL;
                /* open_file may close the cached mappings the pending copies go into */
                copy_all(copies, &pending);
                if (queue_id == NULL && (queue_id = PyLong_FromLongLong(g[1])) == NULL) goto done;
                int found = uncached_target(&r, (Py_ssize_t)tid, queue_id, (int32_t)g[1], file_start, upf, &view, &target, &target_len);
                if (found < 0) goto done;
                if (found == 0) {  /* not to be made here: the row goes back to the caller */
                    PyObject *row = PyLong_FromSsize_t(i);
                    int failed = row == NULL || PyList_Append(skipped, row) < 0;
                    Py_XDECREF(row);
                    if (failed) goto done;
                    break;
                }
                if (view.obj == NULL) {  /* cached by uncached_target */
                    cached = cache_find(r.cache, r.numbers[tid], (int32_t)g[1], file_start);
                    if (cached->file_start < 0) cached = NULL;
                }
            }
            if (pos + count * 20 > target_len) {
                PyErr_Format(PyExc_ValueError, "slots %lld..%lld lie past the end of a %zd-byte queue file", (long long)slot,
                             (long long)(slot + count - 1), target_len);
                if (view.obj != NULL) PyBuffer_Release(&view);
                goto done;
            }
            /* the pages the units go to have disk blocks first, or nothing more is written */
            if (back_copy(cached, target, target_len, pos, pos + count * 20) < 0) {
                populate_error("a consume-queue file");
                if (view.obj != NULL) PyBuffer_Release(&view);
                goto done;
            }
            const unsigned char *source = (const unsigned char *)uv.buf + done * 20;
            if (view.obj != NULL) {
                memcpy(target + pos, source, (size_t)count * 20);
                PyBuffer_Release(&view);
            } else {
                copies[pending++] = (Copy){target + pos, source, (size_t)count * 20};
                if (pending == COPIES_AT_ONCE) copy_all(copies, &pending);
            }
            done += count;
        }
        Py_CLEAR(queue_id);
    }
    result = Py_NewRef(skipped);
done:
    copy_all(copies, &pending);  /* every run looked up before a failure is written */
    PyMem_Free(r.numbers);
    Py_XDECREF(queue_id);
    Py_XDECREF(skipped);
    PyBuffer_Release(&gv);
    PyBuffer_Release(&uv);
    return result;
}

/* crc_prefix(buf, body_at, lengths, crcs, crc32) -> int: how many records, from the first, have
   bodies matching their BODYCRC: record i's body is buf[body_at[i] : body_at[i] + lengths[i]] and
   its stored BODYCRC crcs[i] (int64 columns), matching when crc32(body) & 0x7FFFFFFF equals it;
   `crc32` is a Python crc32 function (zlib-ng's: `record.crc32`), given each body as a memoryview.
   Calling it from C saves the Python loop's per-record overhead.
   A body outside buf is a ValueError. */
static PyObject *crc_prefix(PyObject *self, PyObject *args) {
    Py_buffer bv, av, lv, cv;
    PyObject *crc32;
    if (!PyArg_ParseTuple(args, "y*y*y*y*O", &bv, &av, &lv, &cv, &crc32)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = av.len / 8;
    if (column(&av, 8, n, "body_at") < 0 || column(&lv, 8, n, "lengths") < 0 || column(&cv, 8, n, "crcs") < 0) goto done;
    const int64_t *at = av.buf, *lengths = lv.buf, *crcs = cv.buf;
    const unsigned char *buf = bv.buf;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        int64_t start = at[i], length = lengths[i];
        if (start < 0 || length < 0 || start > bv.len || length > bv.len - start) {
            PyErr_Format(PyExc_ValueError, "record %zd's body (%lld bytes at %lld) lies outside the %zd-byte buffer", i,
                         (long long)length, (long long)start, bv.len);
            goto done;
        }
        PyObject *body = PyMemoryView_FromMemory((char *)buf + start, (Py_ssize_t)length, PyBUF_READ);
        PyObject *value = body ? PyObject_CallOneArg(crc32, body) : NULL;
        Py_XDECREF(body);
        if (value == NULL) goto done;
        uint32_t crc = (uint32_t)PyLong_AsUnsignedLongMask(value);
        Py_DECREF(value);
        if (PyErr_Occurred()) goto done;
        if ((int64_t)(crc & 0x7FFFFFFFu) != crcs[i]) break;
    }
    result = PyLong_FromSsize_t(i);
done:
    PyBuffer_Release(&bv);
    PyBuffer_Release(&av);
    PyBuffer_Release(&lv);
    PyBuffer_Release(&cv);
    return result;
}

/* java_hash(text) -> int: Java's String.hashCode of a str (h = 31 * h + unit over its UTF-16 code
   units, a code point past U+FFFF as its surrogate pair, a lone surrogate as itself), as a
   signed int32. */
static PyObject *java_hash(PyObject *self, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "java_hash takes a str, not %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (PyUnicode_READY(text) < 0) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    const void *data = PyUnicode_DATA(text);
    uint32_t h = 0;
    switch (PyUnicode_KIND(text)) {
    case PyUnicode_1BYTE_KIND:
        for (Py_ssize_t i = 0; i < n; i++) h = h * 31u + ((const Py_UCS1 *)data)[i];
        break;
    case PyUnicode_2BYTE_KIND:
        for (Py_ssize_t i = 0; i < n; i++) h = h * 31u + ((const Py_UCS2 *)data)[i];
        break;
    default:
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = ((const Py_UCS4 *)data)[i];
            if (c >= 0x10000) {
                c -= 0x10000;
                h = h * 31u + (0xD800u + (c >> 10));
                h = h * 31u + (0xDC00u + (c & 0x3FFu));
            } else {
                h = h * 31u + c;
            }
        }
    }
    return PyLong_FromLong((long)(int32_t)h);
}

/* A RowIndex: the rows of the store's frontier table (consume_queue.FrontierTable) by queue code,
   topic number << 32 | queue id as unsigned 32 bits, in an open-addressing table that grows as
   queues are added, for `QueueCommitter.commit` on the dispatch thread: a new queue costs an
   insertion, not a sort of every code (bench/commit.py prints the commit times), and the runs
   of a batch that start at their frontiers are advanced in the same pass. */
typedef struct {
    int64_t code, row; /* row -1: an empty slot */
} RowSlot;

typedef struct {
    PyObject_HEAD
    RowSlot *slots;
    Py_ssize_t mask; /* slots - 1, a power of two less one; at most half the slots are taken */
    Py_ssize_t count;
} RowIndex;

static inline RowSlot *row_find(RowIndex *x, int64_t code) {
    uint64_t h = (uint64_t)code * 0x9E3779B97F4A7C15ull;
    for (Py_ssize_t s = (Py_ssize_t)((h ^ (h >> 32)) & (uint64_t)x->mask);; s = (s + 1) & x->mask) {
        RowSlot *slot = &x->slots[s];
        if (slot->row < 0 || slot->code == code) return slot;
    }
}

static int row_alloc(RowIndex *x, Py_ssize_t slots) {
    RowSlot *table = PyMem_Malloc(slots * sizeof(RowSlot));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < slots; s++) table[s].row = -1;
    RowSlot *old = x->slots;
    Py_ssize_t old_mask = x->mask;
    x->slots = table;
    x->mask = slots - 1;
    if (old != NULL) {
        for (Py_ssize_t s = 0; s <= old_mask; s++)
            if (old[s].row >= 0) *row_find(x, old[s].code) = old[s];
        PyMem_Free(old);
    }
    return 0;
}

static PyObject *row_index_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "RowIndex() takes no arguments");
        return NULL;
    }
    RowIndex *x = (RowIndex *)type->tp_alloc(type, 0);
    if (x == NULL) return NULL;
    if (row_alloc(x, 1024) < 0) {
        Py_DECREF(x);
        return NULL;
    }
    return (PyObject *)x;
}

static void row_index_dealloc(RowIndex *x) {
    PyMem_Free(x->slots);
    Py_TYPE(x)->tp_free((PyObject *)x);
}

static Py_ssize_t row_index_length(RowIndex *x) { return x->count; }

/* set(code, row): the queue of `code` has row `row` (>= 0) from now on. */
static PyObject *row_index_set(RowIndex *x, PyObject *args) {
    long long code, row;
    if (!PyArg_ParseTuple(args, "LL", &code, &row)) return NULL;
    if (row < 0) {
        PyErr_Format(PyExc_ValueError, "a frontier-table row is not negative, not %lld", row);
        return NULL;
    }
    if ((x->count + 1) * 2 > x->mask + 1 && row_alloc(x, (x->mask + 1) * 2) < 0) return NULL;
    RowSlot *slot = row_find(x, code);
    if (slot->row < 0) x->count++;
    slot->code = code;
    slot->row = row;
    Py_RETURN_NONE;
}

/* get(code) -> the row of the queue of `code`, or -1. */
static PyObject *row_index_get(RowIndex *x, PyObject *arg) {
    long long code = PyLong_AsLongLong(arg);
    if (code == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(row_find(x, code)->row);
}

/* advance(numbers, topic_ids, queue_ids, firsts, counts, frontiers, files_end, pending, skip, rows)
   -> int: the fast path of a batch's commit.  Run i is queue (numbers[topic_ids[i]] << 32 |
   queue_ids[i] as unsigned) and its slots [firsts[i], firsts[i] + counts[i]); `numbers`, `firsts`,
   `counts` are int64 columns, `topic_ids`, `queue_ids` int32, `frontiers` and `files_end` the
   table's int64 columns and `pending` its bool one (one byte a row), `skip` None or one byte a run.
   A run is advanced when its queue has a row, starts at the row's frontier, ends within the row's
   files, the row has nothing pending and skip[i] is 0: its frontier becomes the run's end and
   rows[i] (int64, written) the row.  Any other run is left to the caller: rows[i] is -1 when its
   queue has no row, -2 - row when it has one.  Returns how many runs were left. */
static PyObject *row_index_advance(RowIndex *x, PyObject *args) {
    Py_buffer nv, tv, qv, fv, cv, frv, ev, pv, sv = {0}, rv;
    PyObject *skip;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*y*y*Ow*", &nv, &tv, &qv, &fv, &cv, &frv, &ev, &pv, &skip, &rv)) return NULL;
    PyObject *result = NULL;
    int have_skip = skip != Py_None;
    if (have_skip && PyObject_GetBuffer(skip, &sv, PyBUF_SIMPLE) < 0) goto done;
    Py_ssize_t n = fv.len / 8, topics = nv.len / 8, table = frv.len / 8;
    if (column(&nv, 8, topics, "numbers") < 0 || column(&tv, 4, n, "topic_ids") < 0 || column(&qv, 4, n, "queue_ids") < 0
        || column(&fv, 8, n, "firsts") < 0 || column(&cv, 8, n, "counts") < 0 || column(&frv, 8, table, "frontiers") < 0
        || column(&ev, 8, table, "files_end") < 0 || column(&pv, 1, table, "pending") < 0
        || (have_skip && column(&sv, 1, n, "skip") < 0) || column(&rv, 8, n, "rows") < 0)
        goto done;
    const int64_t *numbers = nv.buf, *firsts = fv.buf, *counts = cv.buf, *files_end = ev.buf;
    const int32_t *topic_ids = tv.buf, *queue_ids = qv.buf;
    const unsigned char *pending = pv.buf, *skipped = have_skip ? sv.buf : NULL;
    int64_t *frontiers = frv.buf, *rows = rv.buf;
    Py_ssize_t left = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t tid = topic_ids[i];
        if (tid < 0 || tid >= topics) {
            PyErr_Format(PyExc_ValueError, "run %zd names topic id %d of %zd", i, (int)tid, topics);
            goto done;
        }
        int64_t row = row_find(x, (int64_t)((uint64_t)numbers[tid] << 32 | (uint32_t)queue_ids[i]))->row;
        if (row >= table) {
            PyErr_Format(PyExc_ValueError, "run %zd's queue has row %lld, past the table's %zd", i, (long long)row, table);
            goto done;
        }
        int64_t first = firsts[i], end = first + counts[i];
        if (row >= 0 && frontiers[row] == first && !pending[row] && end <= files_end[row] && (skipped == NULL || !skipped[i])) {
            frontiers[row] = end;
            rows[i] = row;
        } else {
            rows[i] = -2 - row;
            left++;
        }
    }
    result = PyLong_FromSsize_t(left);
done:
    PyBuffer_Release(&nv);
    PyBuffer_Release(&tv);
    PyBuffer_Release(&qv);
    PyBuffer_Release(&fv);
    PyBuffer_Release(&cv);
    PyBuffer_Release(&frv);
    PyBuffer_Release(&ev);
    PyBuffer_Release(&pv);
    if (sv.obj != NULL) PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    return result;
}

static PyMethodDef row_index_methods[] = {
    {"set", (PyCFunction)row_index_set, METH_VARARGS, "set(code, row): the queue of code has that frontier-table row."},
    {"get", (PyCFunction)row_index_get, METH_O, "get(code) -> the queue's row, or -1."},
    {"advance", (PyCFunction)row_index_advance, METH_VARARGS, "Advance a batch's runs that start at their frontiers (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods row_index_as_sequence = {.sq_length = (lenfunc)row_index_length};

static PyTypeObject RowIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidemq.store._dispatch.RowIndex",
    .tp_basicsize = sizeof(RowIndex),
    .tp_dealloc = (destructor)row_index_dealloc,
    .tp_as_sequence = &row_index_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Frontier-table rows by queue code, and a batch's commit fast path (see the module source).",
    .tp_methods = row_index_methods,
    .tp_new = row_index_new,
};

static PyMethodDef methods[] = {
    {"java_hash", java_hash, METH_O, "Java's String.hashCode of a str, as a signed int32."},
    {"index_append", index_append, METH_VARARGS, "Write IndexFile entries and their slot chains (see the module source)."},
    {"scan_into", scan_into, METH_VARARGS, "Walk commit-log records into column arrays (see the module source)."},
    {"write_runs", write_runs, METH_VARARGS, "Copy ConsumeQueue units into their queue files (see the module source)."},
    {"back_pages", back_pages, METH_VARARGS, "Allocate the disk blocks behind pages of a mapping (see the module source)."},
    {"crc_prefix", crc_prefix, METH_VARARGS, "How many records' bodies match their BODYCRC (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tidemq.store._dispatch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__dispatch(void) {
    if (PyType_Ready(&RunCacheType) < 0 || PyType_Ready(&RowIndexType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "RunCache", (PyObject *)&RunCacheType) < 0
        || PyModule_AddObjectRef(m, "RowIndex", (PyObject *)&RowIndexType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
