/* The message ids of jetstream.idempotence.dedupe.IdWindow in C: a hash table of
 * id -> offset with the ids' append order beside it, the same state as the Python window's
 * dict and deques, looked up a batch at a time.
 *
 * Why: a leader looks up every id it is sent in a table of up to `ids_max` ids (a million by
 * default) and adds every new one. In a dict that large each lookup waits on memory two or
 * three times in a row. Here the table is open addressing with linear probing (one slot of
 * hash, id and offset, at most half full), and a batch's lookups and adds first compute
 * every hash and prefetch every slot, so the waits overlap.
 *
 * IdTable()
 *   len(t)                 the ids held
 *   t.get(id)              its offset, or None
 *   t.get_many(ids)        [t.get(id) for id in ids], None for an item that is None
 *   t.add_new(staged)      each (id, offset) of the dict `staged`, in its order, put at the
 *                          end of the order (an id held already takes the new offset)
 *   t.pop(id)              forget the id (its place in the order stays, left behind)
 *   t.forget(count)        forget the oldest `count` ids
 *   t.forget_before(o)     forget the ids of the oldest places, while their offset is < o
 *   t.front_offset()       the offset of the oldest id, or None
 *   t.clear()
 * A place is left behind when its id was stored again later (at a larger offset) or popped:
 * it is dropped, forgetting nothing, when it comes to the front; after each forget the front
 * is an id's own place.
 * Ids are exact str objects; anything else raises TypeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_hash_t hash;
    PyObject *id; /* a strong reference; NULL: empty */
    long long offset;
} slot_t;

typedef struct {
    PyObject_HEAD
    slot_t *slots;
    size_t mask; /* capacity - 1, capacity a power of two */
    Py_ssize_t used;
    /* the order: a ring of (id, offset), each id a strong reference */
    PyObject **ring_ids;
    long long *ring_offsets;
    size_t ring_head, ring_len, ring_cap; /* ring_cap a power of two */
} IdTable;

#define MIN_CAPACITY 64
#define BATCH 64 /* hashes computed and slots prefetched ahead */

static int id_equal(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b) ||
            PyUnicode_KIND(a) != PyUnicode_KIND(b))
        return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b),
                  (size_t)PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a)) == 0;
}

/* The slot holding `id`, or the empty slot where it would go. */
static size_t find(const IdTable *t, PyObject *id, Py_hash_t hash) {
    size_t i = (size_t)hash & t->mask;
    while (t->slots[i].id != NULL) {
        if (t->slots[i].hash == hash && id_equal(t->slots[i].id, id)) return i;
        i = (i + 1) & t->mask;
    }
    return i;
}

static void prefetch(const IdTable *t, Py_hash_t hash) {
    __builtin_prefetch(&t->slots[(size_t)hash & t->mask]);
}

static int resize(IdTable *t, size_t capacity) {
    slot_t *slots = PyMem_Calloc(capacity, sizeof(slot_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    slot_t *old = t->slots;
    const size_t old_capacity = old == NULL ? 0 : t->mask + 1;
    t->slots = slots;
    t->mask = capacity - 1;
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i].id == NULL) continue;
        size_t j = (size_t)old[i].hash & t->mask;
        while (slots[j].id != NULL) j = (j + 1) & t->mask;
        slots[j] = old[i];
    }
    PyMem_Free(old);
    return 0;
}

/* Remove the id at slot i, shifting back the slots after it (no tombstones). */
static void remove_at(IdTable *t, size_t i) {
    PyObject *id = t->slots[i].id;
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->slots[j].id == NULL) break;
        const size_t home = (size_t)t->slots[j].hash & t->mask;
        /* move slot j back to i when its home is not in (i, j] (cyclically) */
        const int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].id = NULL;
    t->used--;
    Py_DECREF(id);
}

static int ring_push(IdTable *t, PyObject *id, long long offset) {
    if (t->ring_len == t->ring_cap) {
        const size_t cap = t->ring_cap ? t->ring_cap * 2 : MIN_CAPACITY;
        PyObject **ids = PyMem_Malloc(cap * sizeof(PyObject *));
        long long *offsets = PyMem_Malloc(cap * sizeof(long long));
        if (ids == NULL || offsets == NULL) {
            PyMem_Free(ids);
            PyMem_Free(offsets);
            PyErr_NoMemory();
            return -1;
        }
        for (size_t k = 0; k < t->ring_len; k++) {
            const size_t at = (t->ring_head + k) & (t->ring_cap - 1);
            ids[k] = t->ring_ids[at];
            offsets[k] = t->ring_offsets[at];
        }
        PyMem_Free(t->ring_ids);
        PyMem_Free(t->ring_offsets);
        t->ring_ids = ids;
        t->ring_offsets = offsets;
        t->ring_cap = cap;
        t->ring_head = 0;
    }
    const size_t at = (t->ring_head + t->ring_len) & (t->ring_cap - 1);
    Py_INCREF(id);
    t->ring_ids[at] = id;
    t->ring_offsets[at] = offset;
    t->ring_len++;
    return 0;
}

/* Drop the front place; 1 when it forgot its id, 0 when the place was left behind. */
static int ring_pop_front(IdTable *t) {
    PyObject *id = t->ring_ids[t->ring_head];
    const long long offset = t->ring_offsets[t->ring_head];
    t->ring_head = (t->ring_head + 1) & (t->ring_cap - 1);
    t->ring_len--;
    int forgot = 0;
    const size_t i = find(t, id, PyObject_Hash(id)); /* a str: its hash is cached */
    if (t->slots[i].id != NULL && t->slots[i].offset == offset) {
        remove_at(t, i);
        forgot = 1;
    }
    Py_DECREF(id);
    return forgot;
}

/* Whether the front place is left behind (its id now elsewhere or gone). */
static int front_left_behind(const IdTable *t) {
    PyObject *id = t->ring_ids[t->ring_head];
    const size_t i = find(t, id, PyObject_Hash(id));
    return t->slots[i].id == NULL || t->slots[i].offset != t->ring_offsets[t->ring_head];
}

static Py_hash_t hash_of(PyObject *id) {
    if (!PyUnicode_CheckExact(id)) {
        PyErr_SetString(PyExc_TypeError, "message ids are str");
        return -1;
    }
    return PyObject_Hash(id);
}

static PyObject *offset_or_none(const IdTable *t, size_t i) {
    if (t->slots[i].id == NULL) Py_RETURN_NONE;
    return PyLong_FromLongLong(t->slots[i].offset);
}

/* -- methods -------------------------------------------------------------------------- */

static PyObject *IdTable_get(IdTable *t, PyObject *id) {
    const Py_hash_t hash = hash_of(id);
    if (hash == -1) return NULL;
    return offset_or_none(t, find(t, id, hash));
}

static PyObject *IdTable_get_many(IdTable *t, PyObject *ids) {
    if (!PyList_CheckExact(ids)) {
        PyErr_SetString(PyExc_TypeError, "get_many takes a list");
        return NULL;
    }
    const Py_ssize_t count = PyList_GET_SIZE(ids);
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    Py_hash_t hashes[BATCH];
    for (Py_ssize_t start = 0; start < count; start += BATCH) {
        const Py_ssize_t stop = start + BATCH < count ? start + BATCH : count;
        for (Py_ssize_t k = start; k < stop; k++) {
            PyObject *id = PyList_GET_ITEM(ids, k);
            if (id == Py_None) {
                hashes[k - start] = -1;
                continue;
            }
            const Py_hash_t hash = hash_of(id);
            if (hash == -1) {
                Py_DECREF(out);
                return NULL;
            }
            hashes[k - start] = hash;
            prefetch(t, hash);
        }
        for (Py_ssize_t k = start; k < stop; k++) {
            PyObject *id = PyList_GET_ITEM(ids, k), *found;
            if (id == Py_None) found = Py_NewRef(Py_None);
            else found = offset_or_none(t, find(t, id, hashes[k - start]));
            if (found == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(out, k, found);
        }
    }
    return out;
}

static int put(IdTable *t, PyObject *id, Py_hash_t hash, long long offset) {
    if ((size_t)(t->used + 1) * 2 > t->mask + 1 && resize(t, (t->mask + 1) * 2) < 0)
        return -1;
    const size_t i = find(t, id, hash);
    if (t->slots[i].id == NULL) {
        Py_INCREF(id);
        t->slots[i].id = id;
        t->slots[i].hash = hash;
        t->used++;
    }
    t->slots[i].offset = offset;
    return ring_push(t, id, offset);
}

static PyObject *IdTable_add_new(IdTable *t, PyObject *staged) {
    if (!PyDict_CheckExact(staged)) {
        PyErr_SetString(PyExc_TypeError, "add_new takes a dict");
        return NULL;
    }
    /* Room first, so that no resize comes between a prefetch and its put. */
    const size_t needed = (size_t)(t->used + PyDict_GET_SIZE(staged)) * 2;
    size_t capacity = t->mask + 1;
    while (capacity < needed) capacity *= 2;
    if (capacity != t->mask + 1 && resize(t, capacity) < 0) return NULL;
    Py_ssize_t at = 0;
    PyObject *id, *offset;
    Py_hash_t hashes[BATCH];
    PyObject *ids[BATCH];
    long long offsets[BATCH];
    for (;;) {
        int n = 0;
        while (n < BATCH && PyDict_Next(staged, &at, &id, &offset)) {
            const Py_hash_t hash = hash_of(id);
            if (hash == -1) return NULL;
            const long long value = PyLong_AsLongLong(offset);
            if (value == -1 && PyErr_Occurred()) return NULL;
            ids[n] = id;
            hashes[n] = hash;
            offsets[n] = value;
            prefetch(t, hash);
            n++;
        }
        for (int k = 0; k < n; k++)
            if (put(t, ids[k], hashes[k], offsets[k]) < 0) return NULL;
        if (n < BATCH) break;
    }
    Py_RETURN_NONE;
}

static PyObject *IdTable_pop(IdTable *t, PyObject *id) {
    const Py_hash_t hash = hash_of(id);
    if (hash == -1) return NULL;
    const size_t i = find(t, id, hash);
    if (t->slots[i].id != NULL) remove_at(t, i);
    Py_RETURN_NONE;
}

static void skip_left_behind(IdTable *t) {
    while (t->ring_len > 0 && front_left_behind(t)) ring_pop_front(t);
}

static PyObject *IdTable_forget(IdTable *t, PyObject *arg) {
    Py_ssize_t count = PyLong_AsSsize_t(arg);
    if (count == -1 && PyErr_Occurred()) return NULL;
    while (count > 0 && t->ring_len > 0) count -= ring_pop_front(t);
    skip_left_behind(t);
    Py_RETURN_NONE;
}

static PyObject *IdTable_forget_before(IdTable *t, PyObject *arg) {
    const long long offset = PyLong_AsLongLong(arg);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    while (t->ring_len > 0 && t->ring_offsets[t->ring_head] < offset) ring_pop_front(t);
    skip_left_behind(t);
    Py_RETURN_NONE;
}

static PyObject *IdTable_front_offset(IdTable *t, PyObject *unused) {
    (void)unused;
    if (t->ring_len == 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(t->ring_offsets[t->ring_head]);
}

static void release_all(IdTable *t) {
    if (t->slots != NULL)
        for (size_t i = 0; i <= t->mask; i++) Py_CLEAR(t->slots[i].id);
    for (size_t k = 0; k < t->ring_len; k++)
        Py_DECREF(t->ring_ids[(t->ring_head + k) & (t->ring_cap - 1)]);
    t->used = 0;
    t->ring_len = 0;
    t->ring_head = 0;
}

static PyObject *IdTable_clear(IdTable *t, PyObject *unused) {
    (void)unused;
    release_all(t);
    Py_RETURN_NONE;
}

static Py_ssize_t IdTable_len(IdTable *t) { return t->used; }

static int IdTable_init(IdTable *t, PyObject *args, PyObject *kwargs) {
    if (!PyArg_ParseTuple(args, ":IdTable") || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "IdTable() takes no arguments");
        return -1;
    }
    release_all(t);
    return t->slots == NULL ? resize(t, MIN_CAPACITY) : 0;
}

static void IdTable_dealloc(IdTable *t) {
    release_all(t);
    PyMem_Free(t->slots);
    PyMem_Free(t->ring_ids);
    PyMem_Free(t->ring_offsets);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef IdTable_methods[] = {
    {"get", (PyCFunction)IdTable_get, METH_O, "get(id) -> offset | None"},
    {"get_many", (PyCFunction)IdTable_get_many, METH_O,
     "get_many(ids) -> [offset | None]: None for an item that is None"},
    {"add_new", (PyCFunction)IdTable_add_new, METH_O,
     "add_new(staged): each (id, offset) of the dict, in order, at the end of the order"},
    {"pop", (PyCFunction)IdTable_pop, METH_O, "pop(id): forget it (its place left behind)"},
    {"forget", (PyCFunction)IdTable_forget, METH_O,
     "forget(count): the oldest `count` ids"},
    {"forget_before", (PyCFunction)IdTable_forget_before, METH_O,
     "forget_before(offset): the ids placed before an offset below `offset`"},
    {"front_offset", (PyCFunction)IdTable_front_offset, METH_NOARGS,
     "front_offset() -> the offset of the oldest place | None"},
    {"clear", (PyCFunction)IdTable_clear, METH_NOARGS, "clear(): forget every id"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods IdTable_as_sequence = {.sq_length = (lenfunc)IdTable_len};

static PyTypeObject IdTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "jetstream.idempotence._ids_c.IdTable",
    .tp_basicsize = sizeof(IdTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Message id -> offset, with the ids' order (jetstream.idempotence.dedupe).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)IdTable_init,
    .tp_dealloc = (destructor)IdTable_dealloc,
    .tp_methods = IdTable_methods,
    .tp_as_sequence = &IdTable_as_sequence,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_ids_c",
    "The id window's table in C (jetstream.idempotence.dedupe).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ids_c(void) {
    if (PyType_Ready(&IdTableType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    Py_INCREF(&IdTableType);
    if (PyModule_AddObject(module, "IdTable", (PyObject *)&IdTableType) < 0) {
        Py_DECREF(&IdTableType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
