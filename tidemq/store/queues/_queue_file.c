/* tidemq.store.queues._queue_file: ConsumeQueue files mapped for dispatch's batch builders.
 *
 * `map_file(path, size, create)` opens a queue file (making it, its queue's directory and any
 * directory above that is missing, when `create`), extends it to `size` bytes if it is shorter
 * (sparse: every creator extends to the same size, so two processes may make one file at once),
 * maps `size` bytes of it shared and read-write, advised MADV_RANDOM (a first write to a page of a
 * new file then reads in that page, not the file's holes ahead), and closes the descriptor: the
 * `Mapping` it returns holds none.  Without `create`, a file (or directory) that is not there
 * gives None; any other failure raises OSError naming the path.
 *
 * What it saves against `consume_queue.map_queue_file` (Python's mmap module): that function
 * opens first and makes the directory on FileNotFoundError (an exception and a second open for
 * every new queue), and `mmap.mmap` stats the file again and keeps a duplicate of its descriptor
 * for the mapping's lifetime (a dup, and a close at unmapping).  A dispatch worker maps every
 * queue file it writes, its own queues' and, with 2 workers, most of the other's.
 *
 * A `Mapping` is a writable buffer of `size` bytes (struct.pack_into, memoryview, NumPy), with
 * `len()`, indexing and slice assignment as `mmap.mmap` has them (`m[a:b] = buffer` of the same
 * length), and `close()`, which unmaps it (a BufferError while a buffer of it is exported, as
 * mmap's close).  It is unmapped when collected too.  The system calls run without the GIL.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    unsigned char *data; /* NULL once closed */
    Py_ssize_t size;
    Py_ssize_t exports; /* buffers of it handed out and not released */
} Mapping;

static PyTypeObject MappingType;

static int mapping_open(Mapping *m) {
    if (m->data == NULL) {
        PyErr_SetString(PyExc_ValueError, "the queue-file mapping is closed");
        return -1;
    }
    return 0;
}

static void mapping_dealloc(Mapping *m) {
    if (m->data != NULL) munmap(m->data, (size_t)m->size);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *mapping_close(Mapping *m, PyObject *unused) {
    if (m->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "cannot close a queue-file mapping while a buffer of it is exported");
        return NULL;
    }
    if (m->data != NULL) {
        munmap(m->data, (size_t)m->size);
        m->data = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *mapping_closed(Mapping *m, void *unused) { return PyBool_FromLong(m->data == NULL); }

static Py_ssize_t mapping_length(Mapping *m) {
    if (mapping_open(m) < 0) return -1;
    return m->size;
}

/* The byte `item` (an integer, negative from the end) names; -1 with IndexError set if there is none. */
static Py_ssize_t byte_index(Mapping *m, PyObject *item) {
    Py_ssize_t i = PyNumber_AsSsize_t(item, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) return -1;
    if (i < 0) i += m->size;
    if (i < 0 || i >= m->size) {
        PyErr_SetString(PyExc_IndexError, "queue-file mapping index out of range");
        return -1;
    }
    return i;
}

/* m[i] -> int, m[a:b:c] -> bytes */
static PyObject *mapping_subscript(Mapping *m, PyObject *item) {
    if (mapping_open(m) < 0) return NULL;
    if (PyIndex_Check(item)) {
        Py_ssize_t i = byte_index(m, item);
        return i < 0 ? NULL : PyLong_FromLong(m->data[i]);
    }
    if (!PySlice_Check(item)) {
        PyErr_Format(PyExc_TypeError, "queue-file mapping indices must be integers or slices, not %.100s", Py_TYPE(item)->tp_name);
        return NULL;
    }
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(item, &start, &stop, &step) < 0) return NULL;
    Py_ssize_t n = PySlice_AdjustIndices(m->size, &start, &stop, step);
    if (step == 1) return PyBytes_FromStringAndSize((const char *)m->data + start, n);
    PyObject *result = PyBytes_FromStringAndSize(NULL, n);
    if (result == NULL) return NULL;
    char *out = PyBytes_AS_STRING(result);
    for (Py_ssize_t k = 0, at = start; k < n; k++, at += step) out[k] = (char)m->data[at];
    return result;
}

/* m[i] = int, m[a:b:c] = a buffer of as many bytes */
static int mapping_ass_subscript(Mapping *m, PyObject *item, PyObject *value) {
    if (mapping_open(m) < 0) return -1;
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "a queue-file mapping's bytes cannot be deleted");
        return -1;
    }
    if (PyIndex_Check(item)) {
        Py_ssize_t i = byte_index(m, item);
        if (i < 0) return -1;
        long byte = PyLong_AsLong(value);
        if (byte == -1 && PyErr_Occurred()) return -1;
        if (byte < 0 || byte > 255) {
            PyErr_SetString(PyExc_ValueError, "a queue-file mapping item must be in range(0, 256)");
            return -1;
        }
        m->data[i] = (unsigned char)byte;
        return 0;
    }
    if (!PySlice_Check(item)) {
        PyErr_Format(PyExc_TypeError, "queue-file mapping indices must be integers or slices, not %.100s", Py_TYPE(item)->tp_name);
        return -1;
    }
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(item, &start, &stop, &step) < 0) return -1;
    Py_ssize_t n = PySlice_AdjustIndices(m->size, &start, &stop, step);
    Py_buffer view;
    if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) < 0) return -1;
    int result = 0;
    if (view.len != n) {
        PyErr_Format(PyExc_IndexError, "a queue-file mapping slice of %zd bytes cannot take %zd", n, view.len);
        result = -1;
    } else if (step == 1) {
        memmove(m->data + start, view.buf, (size_t)n);
    } else {
        for (Py_ssize_t k = 0, at = start; k < n; k++, at += step) m->data[at] = ((const unsigned char *)view.buf)[k];
    }
    PyBuffer_Release(&view);
    return result;
}

static int mapping_getbuffer(Mapping *m, Py_buffer *view, int flags) {
    if (mapping_open(m) < 0) {
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)m, m->data, m->size, 0, flags) < 0) return -1;
    m->exports++;
    return 0;
}

static void mapping_releasebuffer(Mapping *m, Py_buffer *view) { m->exports--; }

static PyMethodDef mapping_methods[] = {
    {"close", (PyCFunction)mapping_close, METH_NOARGS, "Unmap the file (BufferError while a buffer of it is exported)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef mapping_getset[] = {
    {"closed", (getter)mapping_closed, NULL, "Whether the mapping is closed.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMappingMethods mapping_as_mapping = {
    (lenfunc)mapping_length,
    (binaryfunc)mapping_subscript,
    (objobjargproc)mapping_ass_subscript,
};

static PyBufferProcs mapping_as_buffer = {(getbufferproc)mapping_getbuffer, (releasebufferproc)mapping_releasebuffer};

static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tidemq.store.queues._queue_file.Mapping",
    .tp_basicsize = sizeof(Mapping),
    .tp_dealloc = (destructor)mapping_dealloc,
    .tp_as_mapping = &mapping_as_mapping,
    .tp_as_buffer = &mapping_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A queue file mapped shared and read-write, holding no file descriptor (see map_file).",
    .tp_methods = mapping_methods,
    .tp_getset = mapping_getset,
};

/* Make `directory` and every missing directory above it (another process may be making them
   too); 0, or -1 with errno set. */
static int make_directories(char *directory) {
    if (mkdir(directory, 0777) == 0 || errno == EEXIST) return 0;
    if (errno != ENOENT) return -1;
    char *slash = strrchr(directory, '/');
    if (slash == NULL || slash == directory) return -1;
    *slash = '\0';
    int made = make_directories(directory);
    *slash = '/';
    if (made < 0) return -1;
    return mkdir(directory, 0777) == 0 || errno == EEXIST ? 0 : -1;
}

/* Open the file at `path` (with O_CREAT, and its directories made, when `create`); the
   descriptor, or -1 with errno set. */
static int open_queue_file(const char *path, int create) {
    int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
    int fd = open(path, flags, 0644);
    if (fd >= 0 || errno != ENOENT || !create) return fd;
    char *directory = strdup(path);
    if (directory == NULL) return -1;
    char *slash = strrchr(directory, '/');
    int made = -1;
    if (slash != NULL && slash != directory) {
        *slash = '\0';
        made = make_directories(directory);
    } else {
        errno = ENOENT;
    }
    int saved = errno;
    free(directory);
    if (made < 0) {
        errno = saved;
        return -1;
    }
    return open(path, flags, 0644);
}

static PyObject *map_file(PyObject *self, PyObject *args) {
    PyObject *path_obj, *path_bytes;
    Py_ssize_t size;
    int create;
    if (!PyArg_ParseTuple(args, "Onp", &path_obj, &size, &create)) return NULL;
    if (size <= 0) {
        PyErr_Format(PyExc_ValueError, "a queue file is mapped with a positive size, not %zd", size);
        return NULL;
    }
    if (!PyUnicode_FSConverter(path_obj, &path_bytes)) return NULL;
    const char *path = PyBytes_AS_STRING(path_bytes);
    void *data = MAP_FAILED;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    int fd = open_queue_file(path, create);
    if (fd < 0) {
        error = errno;
    } else {
        struct stat st;
        if (fstat(fd, &st) < 0 || (st.st_size < (off_t)size && ftruncate(fd, (off_t)size) < 0)) {
            error = errno;
        } else {
            data = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (data == MAP_FAILED)
                error = errno;
            else
                madvise(data, (size_t)size, MADV_RANDOM);
        }
        close(fd);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(path_bytes);
    if (error) {
        if (error == ENOENT && !create) Py_RETURN_NONE;
        errno = error;
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_obj);
    }
    Mapping *m = PyObject_New(Mapping, &MappingType);
    if (m == NULL) {
        munmap(data, (size_t)size);
        return NULL;
    }
    m->data = data;
    m->size = size;
    m->exports = 0;
    return (PyObject *)m;
}

static PyMethodDef methods[] = {
    {"map_file", map_file, METH_VARARGS,
     "map_file(path, size, create) -> Mapping or None: a queue file mapped (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tidemq.store.queues._queue_file", NULL, -1, methods};

PyMODINIT_FUNC PyInit__queue_file(void) {
    if (PyType_Ready(&MappingType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Mapping", (PyObject *)&MappingType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
