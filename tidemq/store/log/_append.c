/* tidemq.store.log._append: the append path of MessageStore, compiled.
 *
 * `prepare_messages` is MessageEncoder.prepare for the common message (a known topic and tag, no
 * properties or keys), handing any other to the Python encoder.  `put_common` is both at once for
 * one such message whose record ends in the warm pages: a single `put` in one call (a put's own
 * Python around the two cost as much as they do).  `write_records` does for a run of prepared messages what `MessageStore._append_python` does
 * one message at a time in Python (record.py documents the layout): give each message its queue
 * offset, write its whole record in place in the active segment's mapping, advance the commit
 * log's `write_position`, and add a PutResult to `results`.  It writes only while the next
 * record ends within `ready_end` (the warm part of the active segment) and returns the index of
 * the first message it did not write; the Python loop handles that one (segment roll, warming)
 * and calls again.
 *
 * The record bytes and every observable effect are those of the Python loop, which stays the
 * reference: tests run the store's contract with both and compare bytes.  A field out of its
 * range raises struct.error, as struct.pack_into does, after the messages before it were
 * written and accounted for.
 *
 * A record whose properties end with the reserved whole-record CRC property (the encoder reserves
 * it when the store appends RocketMQ's `__CRC32#`) is sealed once every other field is written:
 * `seal_crc_property` writes the CRC of the bytes before the property into its ten digits.
 *
 * Layout of a record (big-endian; ip is 4 or 16 bytes):
 *   TOTALSIZE i32, MAGICCODE i32, BODYCRC i32, QUEUEID i32, FLAG i32, QUEUEOFFSET i64,
 *   PHYSICALOFFSET i64, SYSFLAG i32, BORNTIMESTAMP i64, BORNHOST ip + port i32,
 *   STORETIMESTAMP i64, STOREHOST ip + port i32, RECONSUMETIMES i32, PREPAREDTXOFFSET i64,
 *   BODYLEN i32, body, topic part (length + UTF-8), PROPLEN i16, properties.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define FLAG_BORNHOST_V6 0x10
#define FLAG_STOREHOST_V6 0x20
#define TRANSACTION_TYPE_MASK 0xC
#define TRANSACTION_COMMIT 0x8

static PyObject *struct_error;  /* struct.error */
static PyObject *str_native, *str_topic, *str_queue_id, *str_born_timestamp, *str_flag, *str_sysflag,
    *str_reconsume_times, *str_prepared_transaction_offset, *str_write_position, *str_body, *str_properties,
    *str_keys, *str_tags, *str_born_host;

static inline unsigned char *put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
    return p + 4;
}

static inline unsigned char *put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
    return p + 8;
}

/* A record's fields from TOTALSIZE through its topic (spec §1), at p; returns where the properties'
   length goes.  The host fields' widths come from the byte strings (4 or 16 bytes). */
static unsigned char *write_head(unsigned char *p, long long size, long long magic, long long body_crc,
                                 long long queue_id, long long flag, long long queue_offset, long long offset,
                                 long long sysflag_word, long long born_timestamp, PyObject *born_ip,
                                 long long born_port, long long store_timestamp, PyObject *store_ip,
                                 long long store_port, long long reconsume_times, long long prepared_offset,
                                 PyObject *body, Py_ssize_t body_len, PyObject *topic_part) {
    p = put32(p, (uint32_t)size);
    p = put32(p, (uint32_t)magic);
    p = put32(p, (uint32_t)body_crc);
    p = put32(p, (uint32_t)queue_id);
    p = put32(p, (uint32_t)flag);
    p = put64(p, (uint64_t)queue_offset);
    p = put64(p, (uint64_t)offset);
    p = put32(p, (uint32_t)sysflag_word);
    p = put64(p, (uint64_t)born_timestamp);
    memcpy(p, PyBytes_AS_STRING(born_ip), PyBytes_GET_SIZE(born_ip));
    p = put32(p + PyBytes_GET_SIZE(born_ip), (uint32_t)born_port);
    p = put64(p, (uint64_t)store_timestamp);
    memcpy(p, PyBytes_AS_STRING(store_ip), PyBytes_GET_SIZE(store_ip));
    p = put32(p + PyBytes_GET_SIZE(store_ip), (uint32_t)store_port);
    p = put32(p, (uint32_t)reconsume_times);
    p = put64(p, (uint64_t)prepared_offset);
    p = put32(p, (uint32_t)body_len);
    memcpy(p, PyBytes_AS_STRING(body), body_len);
    p += body_len;
    memcpy(p, PyBytes_AS_STRING(topic_part), PyBytes_GET_SIZE(topic_part));
    return p + PyBytes_GET_SIZE(topic_part);
}

/* An int attribute of `obj` that must fit `bits` signed bits (32 or 64), as struct's 'i'/'q'. */
static int int_attr(PyObject *obj, PyObject *name, int bits, long long *out) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) return -1;
    int rc = 0;
    if (!PyLong_Check(value)) {  /* any integer-like object, as struct takes it */
        PyObject *index = PyNumber_Index(value);
        Py_DECREF(value);
        if (index == NULL) {
            PyErr_Clear();
            PyErr_Format(struct_error, "required argument is not an integer (%U)", name);
            return -1;
        }
        value = index;
    }
    {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred()) rc = -1;
        else if (overflow || (bits == 32 && (v < INT32_MIN || v > INT32_MAX))) {
            PyErr_Format(struct_error, "%U is out of range for a %d-bit field", name, bits);
            rc = -1;
        } else *out = v;
    }
    Py_DECREF(value);
    return rc;
}

static int int_item(PyObject *tuple, Py_ssize_t i, long long *out) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* The next unique key: `prefix` then the counter's next value, masked to 48 bits, as 12 uppercase hex
   digits, written to `text` (room for prefix_len + 12) and returned as a str; NULL with an exception
   set on failure. */
static PyObject *next_unique_key(PyObject *counter, const char *prefix, Py_ssize_t prefix_len, char *text) {
    PyObject *count = PyIter_Next(counter);
    if (count == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the unique-key counter is exhausted");
        return NULL;
    }
    unsigned long long n = PyLong_AsUnsignedLongLongMask(count);
    Py_DECREF(count);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    n &= 0xFFFFFFFFFFFFULL;
    static const char hex[] = "0123456789ABCDEF";
    memcpy(text, prefix, prefix_len);
    for (int k = 11; k >= 0; k--, n >>= 4) text[prefix_len + k] = hex[n & 0xF];
    return PyUnicode_FromStringAndSize(text, prefix_len + 12);
}

/* RocketMQ's whole-record CRC property (record.py, `seal_crc_property`): when the `size` bytes of the
 * record at `rec` end with "__CRC32#" \x01, ten digits and \x02, the digits become the CRC of every
 * byte before the property, least significant digit first.  0, or -1 with an error set. */
#define CRC32_PROPERTY_SIZE 20
static int seal_crc_property(PyObject *crc32, unsigned char *rec, long long size) {
    unsigned char *tail = rec + size - CRC32_PROPERTY_SIZE;
    if (size < CRC32_PROPERTY_SIZE || memcmp(tail, "__CRC32#\x01", 9) != 0 || rec[size - 1] != 2) return 0;
    PyObject *covered = PyMemoryView_FromMemory((char *)rec, (Py_ssize_t)(size - CRC32_PROPERTY_SIZE), PyBUF_READ);
    if (covered == NULL) return -1;
    PyObject *crc_obj = PyObject_CallOneArg(crc32, covered);
    Py_DECREF(covered);
    if (crc_obj == NULL) return -1;
    unsigned long long crc = PyLong_AsUnsignedLongLongMask(crc_obj);
    Py_DECREF(crc_obj);
    if (crc == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    crc &= 0x7FFFFFFFULL;
    for (int k = 0; k < 10; k++, crc /= 10) tail[9 + k] = (unsigned char)('0' + crc % 10);
    return 0;
}

/* A RecordTemplate's `native` tuple: magic, sysflag bits, born ip, born port, store ip, store port,
   topic part, fixed size. */
typedef struct {
    long long magic, sysflag_bits, born_port, store_port, fixed_size;
    PyObject *born_ip, *store_ip, *topic_part;  /* borrowed from the tuple */
} Native;

/* 0, or -1 with TypeError when `native` is not such a tuple. */
static int unpack_native(PyObject *native, Native *n) {
    if (!PyTuple_Check(native) || PyTuple_GET_SIZE(native) != 8) {
        PyErr_SetString(PyExc_TypeError, "template.native is not an 8-tuple");
        return -1;
    }
    n->born_ip = PyTuple_GET_ITEM(native, 2);
    n->store_ip = PyTuple_GET_ITEM(native, 4);
    n->topic_part = PyTuple_GET_ITEM(native, 6);
    if (int_item(native, 0, &n->magic) < 0 || int_item(native, 1, &n->sysflag_bits) < 0 ||
        int_item(native, 3, &n->born_port) < 0 || int_item(native, 5, &n->store_port) < 0 ||
        int_item(native, 7, &n->fixed_size) < 0 || !PyBytes_Check(n->born_ip) || !PyBytes_Check(n->store_ip) ||
        !PyBytes_Check(n->topic_part)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "template.native holds a wrong type");
        return -1;
    }
    return 0;
}

/* write_records(buf, base, ready_end, messages, prepared, start, queue_offsets, store_timestamp,
 *               store_host, results, result_type, commit_log, crc32) -> index of the first message
 *               not written
 *
 * messages: a list or tuple of Message;
 * buf: the active segment's mapping, whose byte 0 is commit-log offset `base`;
 * prepared[i]: (template, body, body_crc, properties_bytes, unique_key) from MessageEncoder;
 * template.native: (magic, sysflag_bits, born_ip, born_port, store_ip, store_port, topic_part,
 *                   fixed_size);
 * commit_log.write_position: where the next record goes, advanced after each record;
 * crc32: the CRC function that seals a record ending with the reserved CRC property. */
static PyObject *write_records(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *messages, *prepared, *queue_offsets, *store_host, *results, *result_type, *commit_log, *crc32;
    long long base, ready_end, store_timestamp;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "OLLOO!nO!LOO!OOO", &buf_obj, &base, &ready_end, &messages,
                          &PyList_Type, &prepared, &start, &PyDict_Type, &queue_offsets, &store_timestamp,
                          &store_host, &PyList_Type, &results, &result_type, &commit_log, &crc32))
        return NULL;
    if (!PyList_Check(messages) && !PyTuple_Check(messages)) {
        PyErr_SetString(PyExc_TypeError, "messages must be a list or a tuple");
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(messages);
    if (start < 0) start = 0;
    if (!PyType_Check(result_type) || !PyType_IsSubtype((PyTypeObject *)result_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "result_type is not a tuple type");
        return NULL;
    }
    if (PyList_GET_SIZE(prepared) != count) {
        PyErr_SetString(PyExc_ValueError, "messages and prepared differ in length");
        return NULL;
    }
    PyObject *position_obj = PyObject_GetAttr(commit_log, str_write_position);
    if (position_obj == NULL) return NULL;
    long long offset = PyLong_AsLongLong(position_obj);
    Py_DECREF(position_obj);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    if (offset < base) {
        PyErr_SetString(PyExc_ValueError, "write_position lies before the mapping");
        return NULL;
    }

    Py_buffer view;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_WRITABLE) < 0) return NULL;
    if (ready_end - base > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "ready_end lies past the end of the mapping");
        return NULL;
    }

    Py_ssize_t i = start;
    PyObject *message = NULL, *prep = NULL;  /* held: reading attributes may run Python code */
    for (; i < count; i++) {
        if (i >= PySequence_Fast_GET_SIZE(messages) || i >= PyList_GET_SIZE(prepared)) break;  /* shrunk meanwhile */
        message = PySequence_Fast_GET_ITEM(messages, i);
        prep = PyList_GET_ITEM(prepared, i);
        Py_INCREF(message);
        Py_INCREF(prep);
        if (!PyTuple_Check(prep) || PyTuple_GET_SIZE(prep) != 5) {
            PyErr_SetString(PyExc_TypeError, "a prepared message is not a 5-tuple");
            goto error;
        }
        PyObject *template = PyTuple_GET_ITEM(prep, 0);
        PyObject *body = PyTuple_GET_ITEM(prep, 1);
        PyObject *properties = PyTuple_GET_ITEM(prep, 3);
        PyObject *unique_key = PyTuple_GET_ITEM(prep, 4);
        if (!PyBytes_Check(body) || !PyBytes_Check(properties)) {
            PyErr_SetString(PyExc_TypeError, "a prepared body or properties is not bytes");
            goto error;
        }
        long long body_crc;
        if (int_item(prep, 2, &body_crc) < 0) goto error;

        PyObject *native = PyObject_GetAttr(template, str_native);
        if (native == NULL) goto error;
        Native n;
        if (unpack_native(native, &n) < 0) {
            Py_DECREF(native);
            goto error;
        }
        long long magic = n.magic, sysflag_bits = n.sysflag_bits, born_port = n.born_port, store_port = n.store_port;
        long long fixed_size = n.fixed_size;
        PyObject *born_ip = n.born_ip, *store_ip = n.store_ip, *topic_part = n.topic_part;
        Py_ssize_t body_len = PyBytes_GET_SIZE(body), properties_len = PyBytes_GET_SIZE(properties);
        long long size = fixed_size + body_len + properties_len;
        if (offset + size > ready_end) {  /* not in warm pages: the Python loop takes it */
            Py_DECREF(native);
            Py_CLEAR(message);
            Py_CLEAR(prep);
            break;
        }

        long long born_timestamp, flag, sysflag, reconsume_times, prepared_offset, queue_id;
        PyObject *born_obj = PyObject_GetAttr(message, str_born_timestamp);
        if (born_obj == NULL) { Py_DECREF(native); goto error; }
        int born_is_none = born_obj == Py_None;
        Py_DECREF(born_obj);
        if (born_is_none) born_timestamp = store_timestamp;  /* the producer's time is unknown */
        else if (int_attr(message, str_born_timestamp, 64, &born_timestamp) < 0) { Py_DECREF(native); goto error; }
        if (int_attr(message, str_flag, 32, &flag) < 0 || int_attr(message, str_sysflag, 32, &sysflag) < 0 ||
            int_attr(message, str_reconsume_times, 32, &reconsume_times) < 0 ||
            int_attr(message, str_prepared_transaction_offset, 64, &prepared_offset) < 0 ||
            int_attr(message, str_queue_id, 32, &queue_id) < 0 || body_crc < INT32_MIN || body_crc > INT32_MAX) {
            Py_DECREF(native);
            if (!PyErr_Occurred()) PyErr_SetString(struct_error, "body CRC out of range");
            goto error;
        }
        long long transaction = sysflag & TRANSACTION_TYPE_MASK;
        int takes_offset = !transaction || transaction == TRANSACTION_COMMIT;

        PyObject *topic = PyObject_GetAttr(message, str_topic);
        if (topic == NULL) { Py_DECREF(native); goto error; }
        PyObject *queue_id_obj = PyObject_GetAttr(message, str_queue_id);
        if (queue_id_obj == NULL) { Py_DECREF(topic); Py_DECREF(native); goto error; }
        PyObject *key = PyTuple_Pack(2, topic, queue_id_obj);
        Py_DECREF(topic);
        Py_DECREF(queue_id_obj);
        if (key == NULL) { Py_DECREF(native); goto error; }
        long long queue_offset = 0;
        if (takes_offset) {
            PyObject *current = PyDict_GetItemWithError(queue_offsets, key);  /* borrowed */
            if (current == NULL && PyErr_Occurred()) { Py_DECREF(key); Py_DECREF(native); goto error; }
            if (current != NULL) {
                queue_offset = PyLong_AsLongLong(current);
                if (queue_offset == -1 && PyErr_Occurred()) { Py_DECREF(key); Py_DECREF(native); goto error; }
            }
        }

        unsigned char *rec = (unsigned char *)view.buf + (offset - base);
        unsigned char *p = write_head(rec, size, magic, body_crc, queue_id, flag, queue_offset, offset,
                       (sysflag & ~(long long)(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)) | sysflag_bits, born_timestamp,
                       born_ip, born_port, store_timestamp, store_ip, store_port, reconsume_times, prepared_offset,
                       body, body_len, topic_part);
        p[0] = (unsigned char)(properties_len >> 8);
        p[1] = (unsigned char)properties_len;
        memcpy(p + 2, PyBytes_AS_STRING(properties), properties_len);
        Py_DECREF(native);
        if (seal_crc_property(crc32, rec, size) < 0) { Py_DECREF(key); goto error; }

        long long record_offset = offset;
        offset += size;
        PyObject *end_obj = PyLong_FromLongLong(offset);
        if (end_obj == NULL || PyObject_SetAttr(commit_log, str_write_position, end_obj) < 0) {
            Py_XDECREF(end_obj);
            Py_DECREF(key);
            goto error;
        }
        Py_DECREF(end_obj);
        if (takes_offset) {
            PyObject *next = PyLong_FromLongLong(queue_offset + 1);
            if (next == NULL || PyDict_SetItem(queue_offsets, key, next) < 0) {
                Py_XDECREF(next);
                Py_DECREF(key);
                goto error;
            }
            Py_DECREF(next);
        }
        Py_DECREF(key);
        /* tuple.__new__(PutResult, (fields,)), as NamedTuple._make does: no Python-level __new__ */
        PyObject *fields = Py_BuildValue("((LLLOLO))", record_offset, size, queue_offset, unique_key,
                                         store_timestamp, store_host);
        if (fields == NULL) goto error;
        PyObject *result = PyTuple_Type.tp_new((PyTypeObject *)result_type, fields, NULL);
        Py_DECREF(fields);
        if (result == NULL) goto error;
        int appended = PyList_Append(results, result);
        Py_DECREF(result);
        if (appended < 0) goto error;
        Py_CLEAR(message);
        Py_CLEAR(prep);
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(i);

error:
    Py_XDECREF(message);
    Py_XDECREF(prep);
    PyBuffer_Release(&view);
    return NULL;
}

/* A common message's fields, as `read_common` found them: the references are owned. */
typedef struct {
    PyObject *topic, *queue_id, *body, *born_obj, *suffix, *template, *native;
    long long qid, flag, sysflag, reconsume_times, prepared_offset;
    long long born_timestamp;  /* 0 when born_obj is None: the store's clock decides */
    Native nat;                /* of template.native */
    Py_ssize_t properties_len;
    long long size;            /* of the whole record */
} Common;

static void common_clear(Common *c) {
    Py_CLEAR(c->topic); Py_CLEAR(c->queue_id); Py_CLEAR(c->body); Py_CLEAR(c->born_obj);
    Py_CLEAR(c->suffix); Py_CLEAR(c->template); Py_CLEAR(c->native);
}

/* Whether `message` is the common case, and its fields: a known topic (a str), an int queue id in
 * range, a bytes body within the limit, numeric fields that fit their record fields, no properties
 * (an empty dict) and no keys (None or an empty list), a tag (None or a str) whose property suffix
 * is cached, a (str, int) born host whose (topic, born host) template is cached, and a record
 * (with a unique-key prefix of `prefix_len` bytes) that fits a segment.  Testing and hashing these
 * runs no Python code: the single put reads them with the append lock held.  Returns 1 with `c`
 * filled, 0 when the message is not the common case (`c` holds nothing; the Python encoder
 * validates it and raises what is wrong), -1 on an error. */
static int read_common(PyObject *message, PyObject *valid_topics, long long max_queue_id, long long max_message_size,
                       PyObject *suffixes, PyObject *templates, PyObject *uniq_property, Py_ssize_t prefix_len,
                       long long segment_size, Common *c) {
    PyObject *attr = NULL, *born_host = NULL, *key = NULL;
    int status = -1, overflow = 0;
    memset(c, 0, sizeof *c);
#define GET(var, obj, name) if ((var = PyObject_GetAttr(obj, name)) == NULL) goto done
#define INT_FIELD(out, name, bits)                                                                   \
    do {                                                                                             \
        GET(attr, message, name);                                                                    \
        if (!PyLong_Check(attr)) goto not_common;                                                    \
        out = PyLong_AsLongLongAndOverflow(attr, &overflow);                                         \
        if (out == -1 && PyErr_Occurred()) goto done;                                                \
        if (overflow || (bits == 32 && (out < INT32_MIN || out > INT32_MAX))) goto not_common;       \
        Py_CLEAR(attr);                                                                              \
    } while (0)
    GET(c->topic, message, str_topic);
    if (!PyUnicode_CheckExact(c->topic)) goto not_common;
    int known = PySet_Contains(valid_topics, c->topic);
    if (known < 0) goto done;
    if (!known) goto not_common;
    GET(c->queue_id, message, str_queue_id);
    if (!PyLong_CheckExact(c->queue_id)) goto not_common;
    c->qid = PyLong_AsLongLongAndOverflow(c->queue_id, &overflow);
    if (c->qid == -1 && PyErr_Occurred()) goto done;
    if (overflow || c->qid < 0 || c->qid > max_queue_id) goto not_common;
    GET(c->body, message, str_body);
    if (!PyBytes_CheckExact(c->body) || PyBytes_GET_SIZE(c->body) > max_message_size) goto not_common;
    INT_FIELD(c->flag, str_flag, 32);
    INT_FIELD(c->sysflag, str_sysflag, 32);
    INT_FIELD(c->reconsume_times, str_reconsume_times, 32);
    INT_FIELD(c->prepared_offset, str_prepared_transaction_offset, 64);
    GET(c->born_obj, message, str_born_timestamp);
    if (c->born_obj != Py_None) {
        if (!PyLong_Check(c->born_obj)) goto not_common;
        c->born_timestamp = PyLong_AsLongLongAndOverflow(c->born_obj, &overflow);
        if (c->born_timestamp == -1 && PyErr_Occurred()) goto done;
        if (overflow) goto not_common;
    }
    GET(attr, message, str_properties);
    if (!PyDict_CheckExact(attr) || PyDict_GET_SIZE(attr) != 0) goto not_common;
    Py_CLEAR(attr);
    GET(attr, message, str_keys);
    if (attr != Py_None && !(PyList_CheckExact(attr) && PyList_GET_SIZE(attr) == 0)) goto not_common;
    Py_CLEAR(attr);
    GET(attr, message, str_tags);
    if (attr != Py_None && !PyUnicode_CheckExact(attr)) goto not_common;
    c->suffix = PyDict_GetItemWithError(suffixes, attr);
    Py_CLEAR(attr);
    if (c->suffix == NULL) {
        if (PyErr_Occurred()) goto done;
        goto not_common;
    }
    Py_INCREF(c->suffix);
    if (!PyBytes_Check(c->suffix)) goto not_common;
    GET(born_host, message, str_born_host);
    if (!PyTuple_CheckExact(born_host) || PyTuple_GET_SIZE(born_host) != 2 ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(born_host, 0)) || !PyLong_CheckExact(PyTuple_GET_ITEM(born_host, 1)))
        goto not_common;
    key = PyTuple_Pack(2, c->topic, born_host);
    if (key == NULL) goto done;
    c->template = PyDict_GetItemWithError(templates, key);
    if (c->template == NULL) {
        if (PyErr_Occurred()) goto done;
        goto not_common;
    }
    Py_INCREF(c->template);
    GET(c->native, c->template, str_native);
    if (unpack_native(c->native, &c->nat) < 0) goto done;
    c->properties_len = PyBytes_GET_SIZE(uniq_property) + prefix_len + 12 + PyBytes_GET_SIZE(c->suffix);
    c->size = c->nat.fixed_size + PyBytes_GET_SIZE(c->body) + c->properties_len;
    if (c->properties_len > 32767 || c->size + 8 > segment_size) goto not_common;  /* the encoder raises the error */
    status = 1;
    goto done;
not_common:
    status = 0;
done:
#undef GET
#undef INT_FIELD
    Py_XDECREF(attr); Py_XDECREF(born_host); Py_XDECREF(key);
    if (status != 1) common_clear(c);
    return status;
}

/* The unique-key prefix as UTF-8 (at most 100 bytes: a key's text has room for 128), or NULL with
   an error set. */
static const char *key_prefix_utf8(PyObject *prefix_obj, Py_ssize_t *prefix_len) {
    const char *prefix = PyUnicode_Check(prefix_obj) ? PyUnicode_AsUTF8AndSize(prefix_obj, prefix_len) : NULL;
    if (prefix == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "the unique-key prefix is not a str");
        return NULL;
    }
    if (*prefix_len > 100) {
        PyErr_SetString(PyExc_ValueError, "the unique-key prefix is too long");
        return NULL;
    }
    return prefix;
}

/* A common record's properties at `out` (c->properties_len bytes): the unique-key property, its
   key's text, then the tag's cached suffix. */
static void write_common_properties(char *out, PyObject *uniq_property, const char *text, Py_ssize_t text_len,
                                    const Common *c) {
    memcpy(out, PyBytes_AS_STRING(uniq_property), PyBytes_GET_SIZE(uniq_property));
    out += PyBytes_GET_SIZE(uniq_property);
    memcpy(out, text, text_len);
    memcpy(out + text_len, PyBytes_AS_STRING(c->suffix), PyBytes_GET_SIZE(c->suffix));
}

/* The body CRC as a record keeps it (31 bits), or -1 with an error set. */
static long long body_crc(PyObject *crc32, PyObject *body) {
    PyObject *crc = PyObject_CallOneArg(crc32, body);
    if (crc == NULL) return -1;
    unsigned long long c = PyLong_AsUnsignedLongLongMask(crc);
    Py_DECREF(crc);
    if (c == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    return (long long)(c & 0x7FFFFFFFULL);
}

/* The common case of MessageEncoder.prepare, for one message (`read_common`).  Returns a new
 * reference to (template, body, body_crc, properties_bytes, unique_key), Py_None (new reference)
 * when the message is not the common case, NULL on an error. */
static PyObject *prepare_common(PyObject *message, PyObject *valid_topics, long long max_queue_id,
                                long long max_message_size, PyObject *suffixes, PyObject *templates,
                                PyObject *uniq_property, PyObject *key_prefix, PyObject *counter,
                                PyObject *crc32, long long segment_size) {
    Py_ssize_t prefix_len;
    const char *prefix = key_prefix_utf8(key_prefix, &prefix_len);
    if (prefix == NULL) return NULL;
    Common c;
    int common = read_common(message, valid_topics, max_queue_id, max_message_size, suffixes, templates,
                             uniq_property, prefix_len, segment_size, &c);
    if (common < 0) return NULL;
    if (common == 0) Py_RETURN_NONE;
    PyObject *result = NULL, *properties_bytes = NULL;
    char text[128];
    PyObject *unique_key = next_unique_key(counter, prefix, prefix_len, text);
    if (unique_key == NULL) goto done;
    properties_bytes = PyBytes_FromStringAndSize(NULL, c.properties_len);
    if (properties_bytes == NULL) goto done;
    write_common_properties(PyBytes_AS_STRING(properties_bytes), uniq_property, text, prefix_len + 12, &c);
    long long crc = body_crc(crc32, c.body);
    if (crc < 0) goto done;
    result = Py_BuildValue("(OOLOO)", c.template, c.body, crc, properties_bytes, unique_key);
done:
    Py_XDECREF(unique_key);
    Py_XDECREF(properties_bytes);
    common_clear(&c);
    return result;
}

/* prepare_messages(messages, prepare, valid_topics, max_queue_id, max_message_size, suffixes,
 *                  templates, uniq_property, key_prefix, counter, crc32, segment_size) -> list
 *
 * MessageEncoder.prepare for each message, in order: the common case here, any other through
 * `prepare` (the Python method, which validates and raises, fills the caches, and handles
 * properties and keys).  The caches and the unique-key counter are the encoder's own. */
static PyObject *prepare_messages(PyObject *self, PyObject *args) {
    PyObject *messages, *prepare, *valid_topics, *suffixes, *templates, *uniq_property, *key_prefix, *counter, *crc32;
    long long max_queue_id, max_message_size, segment_size;
    if (!PyArg_ParseTuple(args, "OOO!LLO!O!SUOOL", &messages, &prepare, &PySet_Type, &valid_topics, &max_queue_id,
                          &max_message_size, &PyDict_Type, &suffixes, &PyDict_Type, &templates, &uniq_property,
                          &key_prefix, &counter, &crc32, &segment_size))
        return NULL;
    if (!PyList_Check(messages) && !PyTuple_Check(messages)) {
        PyErr_SetString(PyExc_TypeError, "messages must be a list or a tuple");
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(messages);
    PyObject *prepared = PyList_New(count);
    if (prepared == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *message = PySequence_Fast_GET_ITEM(messages, i);
        PyObject *one = prepare_common(message, valid_topics, max_queue_id, max_message_size, suffixes, templates,
                                       uniq_property, key_prefix, counter, crc32, segment_size);
        if (one == Py_None) {
            Py_DECREF(one);
            one = PyObject_CallOneArg(prepare, message);
        }
        if (one == NULL) {
            Py_DECREF(prepared);
            return NULL;
        }
        PyList_SET_ITEM(prepared, i, one);
    }
    return prepared;
}

/* put_common(state, message, region) -> PutResult, or None when the message is not the common
 * case.
 *
 * `MessageStore.put` for one common message, the append lock held: the checks of
 * `read_common` and the record of `write_records` in one pass, reading each attribute of the
 * message once (it must be a Message itself, no subclass, so that reading is side-effect free),
 * and writing the properties straight into the log.  Returns None, having changed nothing (no
 * clock read, no unique key taken), when anything is unusual: another type or an unknown topic,
 * tag or (topic, born host), properties or keys, a field out of range, or a record that does not
 * end within the active segment's warm pages; the caller then appends it the ordinary way.
 *
 * state: a `message_encoder.CommonPutState` (a tuple of 15, in its fields' order);
 * state.unique_keys: the encoder's _UniqueKeys (its `prefix` and `counter` are read at each call);
 * state.clock: the store's clock, or None for the wall clock in milliseconds (`wall_clock_ms`);
 * state.commit_log: its `write_position` is read, and advanced past the record;
 * region: `CommitLog.warm_region()`: (buf, base, ready_end), the active segment's mapping, the
 * commit-log offset of its byte 0 and the offset up to which its pages are warm; or None. */
static PyObject *str_prefix, *str_counter;

static PyObject *put_common(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 15) {
        PyErr_SetString(PyExc_TypeError, "put_common(state, message, region): state is a 15-tuple");
        return NULL;
    }
    PyObject *state = args[0], *message = args[1], *region = args[2];
    if (region == Py_None) Py_RETURN_NONE;  /* no warm pages yet: the ordinary path reserves them */
    if (!PyTuple_Check(region) || PyTuple_GET_SIZE(region) != 3) {
        PyErr_SetString(PyExc_TypeError, "put_common: region is (buf, base, ready_end) or None");
        return NULL;
    }
    PyObject *buf = PyTuple_GET_ITEM(region, 0);
    PyObject *message_type = PyTuple_GET_ITEM(state, 0), *valid_topics = PyTuple_GET_ITEM(state, 1);
    PyObject *suffixes = PyTuple_GET_ITEM(state, 4), *templates = PyTuple_GET_ITEM(state, 5);
    PyObject *uniq_property = PyTuple_GET_ITEM(state, 6), *unique_keys = PyTuple_GET_ITEM(state, 7);
    PyObject *crc32 = PyTuple_GET_ITEM(state, 8), *queue_offsets = PyTuple_GET_ITEM(state, 10);
    PyObject *store_host = PyTuple_GET_ITEM(state, 11), *result_type = PyTuple_GET_ITEM(state, 12);
    PyObject *commit_log = PyTuple_GET_ITEM(state, 13), *clock = PyTuple_GET_ITEM(state, 14);
    long long base = PyLong_AsLongLong(PyTuple_GET_ITEM(region, 1)), ready_end = PyLong_AsLongLong(PyTuple_GET_ITEM(region, 2));
    long long max_queue_id = PyLong_AsLongLong(PyTuple_GET_ITEM(state, 2));
    long long max_message_size = PyLong_AsLongLong(PyTuple_GET_ITEM(state, 3));
    long long segment_size = PyLong_AsLongLong(PyTuple_GET_ITEM(state, 9));
    if (PyErr_Occurred()) return NULL;
    if (!PySet_Check(valid_topics) || !PyDict_Check(suffixes) || !PyDict_Check(templates) ||
        !PyBytes_Check(uniq_property) || !PyDict_Check(queue_offsets) || !PyType_Check(result_type) ||
        !PyType_IsSubtype((PyTypeObject *)result_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "put_common: state holds a wrong type");
        return NULL;
    }
    if ((PyObject *)Py_TYPE(message) != message_type) Py_RETURN_NONE;

    /* Everything below until `decided` only reads: anything unusual is `not_common`.  Every
     * reference taken is released at `done`. */
    PyObject *attr = NULL, *key = NULL, *prefix_obj = NULL, *counter = NULL;
    PyObject *result = NULL, *unique_key = NULL;
    Common c = {0};
    Py_buffer view = {0};
    int have_view = 0;
#define GET(var, obj, name) if ((var = PyObject_GetAttr(obj, name)) == NULL) goto done
    GET(prefix_obj, unique_keys, str_prefix);
    Py_ssize_t prefix_len;
    const char *prefix = key_prefix_utf8(prefix_obj, &prefix_len);
    if (prefix == NULL) goto done;
    int common = read_common(message, valid_topics, max_queue_id, max_message_size, suffixes, templates,
                             uniq_property, prefix_len, segment_size, &c);
    if (common < 0) goto done;
    if (common == 0) goto not_common;
    long long size = c.size;

    /* where it goes: within the active segment's warm pages, or the ordinary path rolls or warms */
    GET(attr, commit_log, str_write_position);
    long long offset = PyLong_AsLongLong(attr);
    Py_CLEAR(attr);
    if (offset == -1 && PyErr_Occurred()) goto done;
    if (offset + size > ready_end) goto not_common;
    if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0) goto done;
    have_view = 1;
    if (offset < base || ready_end - base > view.len) {
        PyErr_SetString(PyExc_ValueError, "the warm region lies outside the active segment's mapping");
        goto done;
    }
    long long transaction = c.sysflag & TRANSACTION_TYPE_MASK;
    int takes_offset = !transaction || transaction == TRANSACTION_COMMIT;
    key = PyTuple_Pack(2, c.topic, c.queue_id);
    if (key == NULL) goto done;
    long long queue_offset = 0;
    if (takes_offset) {
        PyObject *current = PyDict_GetItemWithError(queue_offsets, key);  /* borrowed */
        if (current == NULL && PyErr_Occurred()) goto done;
        if (current != NULL) {
            queue_offset = PyLong_AsLongLong(current);
            if (queue_offset == -1 && PyErr_Occurred()) goto done;
        }
    }
    GET(counter, unique_keys, str_counter);

    /* decided: the store's clock, the next unique key, the body CRC, then the record */
    long long store_timestamp;
    if (clock == Py_None) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        store_timestamp = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    } else {
        PyObject *now = PyObject_CallNoArgs(clock);
        if (now == NULL) goto done;
        store_timestamp = PyLong_AsLongLong(now);
        Py_DECREF(now);
        if (store_timestamp == -1 && PyErr_Occurred()) goto done;
    }
    long long born_timestamp = c.born_obj == Py_None ? store_timestamp : c.born_timestamp;  /* unknown: now */
    char text[128];
    unique_key = next_unique_key(counter, prefix, prefix_len, text);
    if (unique_key == NULL) goto done;
    long long crc = body_crc(crc32, c.body);
    if (crc < 0) goto done;
    /* the result and the new values before the write, so that no failure can follow a written record */
    PyObject *items[6] = {PyLong_FromLongLong(offset), PyLong_FromLongLong(size), PyLong_FromLongLong(queue_offset),
                          unique_key, PyLong_FromLongLong(store_timestamp), store_host};
    Py_INCREF(unique_key);
    Py_INCREF(store_host);
    PyObject *end_obj = PyLong_FromLongLong(offset + size);
    PyObject *next_obj = PyLong_FromLongLong(queue_offset + 1);
    if (items[0] != NULL && items[1] != NULL && items[2] != NULL && items[4] != NULL && end_obj != NULL && next_obj != NULL)
        result = ((PyTypeObject *)result_type)->tp_alloc((PyTypeObject *)result_type, 6);
    if (result == NULL) {
        for (int k = 0; k < 6; k++) Py_XDECREF(items[k]);
        Py_XDECREF(end_obj);
        Py_XDECREF(next_obj);
        goto done;
    }
    for (int k = 0; k < 6; k++) PyTuple_SET_ITEM(result, k, items[k]);  /* tuple.__new__(PutResult, fields) */

    unsigned char *rec = (unsigned char *)view.buf + (offset - base);
    const Native *nat = &c.nat;
    unsigned char *p = write_head(rec, size, nat->magic, crc, c.qid, c.flag, queue_offset, offset,
                   (c.sysflag & ~(long long)(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)) | nat->sysflag_bits, born_timestamp,
                   nat->born_ip, nat->born_port, store_timestamp, nat->store_ip, nat->store_port, c.reconsume_times,
                   c.prepared_offset, c.body, PyBytes_GET_SIZE(c.body), nat->topic_part);
    *p++ = (unsigned char)(c.properties_len >> 8);
    *p++ = (unsigned char)c.properties_len;
    write_common_properties((char *)p, uniq_property, text, prefix_len + 12, &c);

    /* the record is written: seal it, then account for it (these only fail for want of memory;
       a record not accounted for lies past write_position, where the next one overwrites it) */
    int failed = seal_crc_property(crc32, rec, size) < 0;
    if (!failed) failed = PyObject_SetAttr(commit_log, str_write_position, end_obj) < 0;
    if (!failed && takes_offset) failed = PyDict_SetItem(queue_offsets, key, next_obj) < 0;
    Py_DECREF(end_obj);
    Py_DECREF(next_obj);
    if (failed) Py_CLEAR(result);
    goto done;

not_common:
    result = Py_None;
    Py_INCREF(result);
done:
#undef GET
    if (have_view) PyBuffer_Release(&view);
    common_clear(&c);
    Py_XDECREF(attr); Py_XDECREF(key); Py_XDECREF(prefix_obj); Py_XDECREF(counter); Py_XDECREF(unique_key);
    return result;
}

static PyMethodDef methods[] = {
    {"put_common", (PyCFunction)(void (*)(void))put_common, METH_FASTCALL,
     "Append one common message in a single pass, the append lock held: its PutResult, or None "
     "(nothing done) when it is not the common case or does not fit the warm pages."},
    {"prepare_messages", prepare_messages, METH_VARARGS,
     "MessageEncoder.prepare for each message: the common case compiled, any other through prepare."},
    {"write_records", write_records, METH_VARARGS,
     "Write prepared records in place while they fit the warm part of the active segment; "
     "returns the index of the first message not written."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_append", NULL, -1, methods};

PyMODINIT_FUNC PyInit__append(void) {
    PyObject *struct_module = PyImport_ImportModule("struct");
    if (struct_module == NULL) return NULL;
    struct_error = PyObject_GetAttrString(struct_module, "error");
    Py_DECREF(struct_module);
    if (struct_error == NULL) return NULL;
    if (!(str_native = PyUnicode_InternFromString("native")) || !(str_topic = PyUnicode_InternFromString("topic")) ||
        !(str_queue_id = PyUnicode_InternFromString("queue_id")) ||
        !(str_born_timestamp = PyUnicode_InternFromString("born_timestamp")) ||
        !(str_flag = PyUnicode_InternFromString("flag")) || !(str_sysflag = PyUnicode_InternFromString("sysflag")) ||
        !(str_reconsume_times = PyUnicode_InternFromString("reconsume_times")) ||
        !(str_prepared_transaction_offset = PyUnicode_InternFromString("prepared_transaction_offset")) ||
        !(str_write_position = PyUnicode_InternFromString("write_position")) ||
        !(str_body = PyUnicode_InternFromString("body")) || !(str_properties = PyUnicode_InternFromString("properties")) ||
        !(str_keys = PyUnicode_InternFromString("keys")) || !(str_tags = PyUnicode_InternFromString("tags")) ||
        !(str_born_host = PyUnicode_InternFromString("born_host")) ||
        !(str_prefix = PyUnicode_InternFromString("prefix")) || !(str_counter = PyUnicode_InternFromString("counter")))
        return NULL;
    return PyModule_Create(&module);
}
