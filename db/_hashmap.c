/* kvscope.db._hashmap: block hash maps for the watch fold, open addressing.
 *
 * HashMap: block hash -> int64, unordered (held blocks, remembered removals).
 * ObjectMap: block hash -> object, in insertion order (the prefix tree's nodes).
 *
 * Why: folding a fleet's KV-event stream is mostly lookups and inserts of block
 * hashes in maps of 0.5-2M entries (each source's held blocks and its remembered
 * removals). A Python dict entry there costs ~110-140 bytes (entry, index, key and
 * value objects) and two or three cache misses an operation. Here a slot is 16
 * bytes, key and value inline, one miss an operation, and the bulk operations the
 * fold calls once per event (16 hashes) prefetch every slot first, so their misses
 * overlap instead of queueing.
 *
 * Keys are the signed 64-bit hashes the recorder stores. Anything else a general
 * path may carry (a string, an int wider than 64 bits) goes to a plain dict beside
 * the table, so the map answers as a dict would for any key. Values are int64.
 * Key 0 is the empty slot's mark and is kept apart (has_zero). Deletion shifts the
 * probe run back (no tombstones), so churn does not slow lookups down.
 * Iteration order is not insertion order (db.hashmap says who may rely on it: none).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t key;
    int64_t value;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    uint64_t mask;     /* capacity - 1; capacity a power of two */
    Py_ssize_t used;   /* keys in slots (key 0 not among them) */
    int has_zero;
    int64_t zero_value;
    PyObject *other;   /* dict of keys that are not int64, or NULL */
} HashMap;

#define MIN_CAPACITY 16
#define BULK 32 /* keys hashed and prefetched ahead of probing */

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* 1: an int64 in *out; 0: another key (for the side dict); -1: error set. */
static inline int as_key(PyObject *o, int64_t *out)
{
    if (PyLong_CheckExact(o) || PyLong_Check(o)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow)
            return 0;
        if (v == -1 && PyErr_Occurred())
            return -1;
        *out = (int64_t)v;
        return 1;
    }
    return 0;
}

static int as_value(PyObject *o, int64_t *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "HashMap values are 64-bit ints");
        }
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* ---- shared by both maps: the side dict of other keys, get/pop's arguments, == ---- */

/* other[key], borrowed, or NULL (an error set only on a real error). */
static inline PyObject *side_get(PyObject *other, PyObject *key)
{
    return other ? PyDict_GetItemWithError(other, key) : NULL;
}

/* other.pop(key): a new reference, or NULL (an error set only on a real error). */
static PyObject *side_pop(PyObject *other, PyObject *key)
{
    PyObject *o = side_get(other, key);
    if (!o)
        return NULL;
    Py_INCREF(o);
    if (PyDict_DelItem(other, key) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    return o;
}

/* (*other)[key] = value, the dict made on first use: 1 if the key was new, 0 if not,
 * -1 on error. */
static int side_put(PyObject **other, PyObject *key, PyObject *value)
{
    if (!*other && !(*other = PyDict_New()))
        return -1;
    Py_ssize_t before = PyDict_GET_SIZE(*other);
    if (PyDict_SetItem(*other, key, value) < 0)
        return -1;
    return PyDict_GET_SIZE(*other) > before;
}

/* key in other: 1, 0, or -1 on error. */
static inline int side_has(PyObject *other, PyObject *key)
{
    return other ? PyDict_Contains(other, key) : 0;
}

static inline Py_ssize_t side_len(PyObject *other)
{
    return other ? PyDict_GET_SIZE(other) : 0;
}

/* del other[key]: 0, or -1 with KeyError (or a real error) set. */
static int side_del(PyObject *other, PyObject *key)
{
    if (other)
        return PyDict_DelItem(other, key);
    PyErr_SetObject(PyExc_KeyError, key);
    return -1;
}

/* get(key[, default]) and pop(key[, default]) take one or two arguments. */
static int key_and_default(Py_ssize_t nargs, const char *usage)
{
    if (nargs >= 1 && nargs <= 2)
        return 0;
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
}

/* What get/pop answer for a key not held (no error set): the default if given;
 * otherwise None (get) or KeyError (pop, must_hold). */
static PyObject *not_held(PyObject *const *args, Py_ssize_t nargs, int must_hold)
{
    if (nargs == 2 || !must_hold) {
        PyObject *d = nargs == 2 ? args[1] : Py_None;
        Py_INCREF(d);
        return d;
    }
    PyErr_SetObject(PyExc_KeyError, args[0]);
    return NULL;
}

/* == and != as dicts of the same pairs would compare (tests, mostly); as_dict makes
 * a new dict of a map of self's type. */
static PyObject *compare_as_dicts(PyObject *self, PyObject *other, int op,
                                  PyObject *(*as_dict)(PyObject *))
{
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *mine = as_dict(self);
    if (!mine)
        return NULL;
    PyObject *theirs = Py_TYPE(other) == Py_TYPE(self) ? as_dict(other) : (Py_INCREF(other), other);
    if (!theirs) {
        Py_DECREF(mine);
        return NULL;
    }
    PyObject *out = PyObject_RichCompare(mine, theirs, op);
    Py_DECREF(mine);
    Py_DECREF(theirs);
    return out;
}

/* ---- HashMap: the table ---------------------------------------------------------- */

static inline Slot *find(HashMap *m, int64_t key)
{
    uint64_t i = mix((uint64_t)key) & m->mask;
    for (;;) {
        Slot *s = &m->slots[i];
        if (s->key == key)
            return s;
        if (s->key == 0)
            return NULL;
        i = (i + 1) & m->mask;
    }
}

static int resize(HashMap *m, uint64_t capacity)
{
    Slot *old = m->slots;
    uint64_t old_cap = old ? m->mask + 1 : 0;
    Slot *slots = PyMem_Calloc((size_t)capacity, sizeof(Slot));
    if (!slots) {
        PyErr_NoMemory();
        return -1;
    }
    m->slots = slots;
    m->mask = capacity - 1;
    for (uint64_t j = 0; j < old_cap; j++) {
        if (old[j].key) {
            uint64_t i = mix((uint64_t)old[j].key) & m->mask;
            while (slots[i].key)
                i = (i + 1) & m->mask;
            slots[i] = old[j];
        }
    }
    PyMem_Free(old);
    return 0;
}

/* Room for n more keys at a load of at most 3/4. */
static inline int reserve(HashMap *m, Py_ssize_t n)
{
    uint64_t need = (uint64_t)(m->used + n);
    uint64_t cap = m->mask + 1;
    if (need * 4 <= cap * 3)
        return 0;
    while (need * 4 > cap * 3)
        cap *= 2;
    return resize(m, cap);
}

/* Insert or overwrite; returns 1 if the key is new. Room must be reserved. */
static inline int put(HashMap *m, int64_t key, int64_t value)
{
    if (key == 0) {
        int fresh = !m->has_zero;
        m->has_zero = 1;
        m->zero_value = value;
        return fresh;
    }
    uint64_t i = mix((uint64_t)key) & m->mask;
    for (;;) {
        Slot *s = &m->slots[i];
        if (s->key == key) {
            s->value = value;
            return 0;
        }
        if (s->key == 0) {
            s->key = key;
            s->value = value;
            m->used++;
            return 1;
        }
        i = (i + 1) & m->mask;
    }
}

/* Remove the key if held; returns 1 and its value in *value if it was. */
static inline int take(HashMap *m, int64_t key, int64_t *value)
{
    if (key == 0) {
        if (!m->has_zero)
            return 0;
        m->has_zero = 0;
        *value = m->zero_value;
        return 1;
    }
    Slot *s = find(m, key);
    if (!s)
        return 0;
    *value = s->value;
    /* backward-shift deletion: pull later keys of the probe run into the hole */
    uint64_t hole = (uint64_t)(s - m->slots);
    uint64_t j = hole;
    for (;;) {
        j = (j + 1) & m->mask;
        Slot *t = &m->slots[j];
        if (t->key == 0)
            break;
        uint64_t home = mix((uint64_t)t->key) & m->mask;
        /* t may move to hole if hole lies cyclically in [home, j) */
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->slots[hole] = *t;
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->slots[hole].value = 0;
    m->used--;
    return 1;
}

static inline int holds(HashMap *m, int64_t key, int64_t *value)
{
    if (key == 0) {
        if (m->has_zero && value)
            *value = m->zero_value;
        return m->has_zero;
    }
    Slot *s = find(m, key);
    if (s && value)
        *value = s->value;
    return s != NULL;
}

/* ---- the type ---------------------------------------------------------------- */

static PyObject *HashMap_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    HashMap *m = (HashMap *)type->tp_alloc(type, 0);
    if (!m)
        return NULL;
    m->slots = PyMem_Calloc(MIN_CAPACITY, sizeof(Slot));
    if (!m->slots) {
        Py_DECREF(m);
        return PyErr_NoMemory();
    }
    m->mask = MIN_CAPACITY - 1;
    return (PyObject *)m;
}

static PyObject *HashMap_update_from(HashMap *m, PyObject *src);

static int HashMap_init(HashMap *m, PyObject *args, PyObject *kwds)
{
    PyObject *src = NULL;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "HashMap() takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "|O:HashMap", &src))
        return -1;
    if (src) {
        PyObject *r = HashMap_update_from(m, src);
        if (!r)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

static int HashMap_traverse(HashMap *m, visitproc visit, void *arg)
{
    Py_VISIT(m->other);
    return 0;
}

static int HashMap_clear_refs(HashMap *m)
{
    Py_CLEAR(m->other);
    return 0;
}

static void HashMap_dealloc(HashMap *m)
{
    PyObject_GC_UnTrack(m);
    Py_CLEAR(m->other);
    PyMem_Free(m->slots);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t HashMap_len(HashMap *m)
{
    return m->used + m->has_zero + side_len(m->other);
}

static int HashMap_contains(HashMap *m, PyObject *key)
{
    int64_t k;
    int r = as_key(key, &k);
    if (r < 0)
        return -1;
    if (r)
        return holds(m, k, NULL);
    return side_has(m->other, key);
}

static PyObject *HashMap_subscript(HashMap *m, PyObject *key)
{
    int64_t k, v;
    int r = as_key(key, &k);
    if (r < 0)
        return NULL;
    if (r) {
        if (holds(m, k, &v))
            return PyLong_FromLongLong(v);
    } else {
        PyObject *o = side_get(m->other, key);
        if (o) {
            Py_INCREF(o);
            return o;
        }
        if (PyErr_Occurred())
            return NULL;
    }
    PyErr_SetObject(PyExc_KeyError, key);
    return NULL;
}

static int HashMap_ass_subscript(HashMap *m, PyObject *key, PyObject *value)
{
    int64_t k, v;
    int r = as_key(key, &k);
    if (r < 0)
        return -1;
    if (!value) { /* del m[key] */
        if (!r)
            return side_del(m->other, key);
        if (take(m, k, &v))
            return 0;
        PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    if (as_value(value, &v) < 0)
        return -1;
    if (!r)
        return side_put(&m->other, key, value) < 0 ? -1 : 0;
    if (reserve(m, 1) < 0)
        return -1;
    put(m, k, v);
    return 0;
}

static PyObject *HashMap_get(HashMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (key_and_default(nargs, "get(key[, default])") < 0)
        return NULL;
    int64_t k, v;
    int r = as_key(args[0], &k);
    if (r < 0)
        return NULL;
    if (r) {
        if (holds(m, k, &v))
            return PyLong_FromLongLong(v);
    } else {
        PyObject *o = side_get(m->other, args[0]);
        if (o) {
            Py_INCREF(o);
            return o;
        }
        if (PyErr_Occurred())
            return NULL;
    }
    return not_held(args, nargs, 0);
}

static PyObject *HashMap_pop(HashMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (key_and_default(nargs, "pop(key[, default])") < 0)
        return NULL;
    int64_t k, v;
    int r = as_key(args[0], &k);
    if (r < 0)
        return NULL;
    if (r) {
        if (take(m, k, &v))
            return PyLong_FromLongLong(v);
    } else {
        PyObject *o = side_pop(m->other, args[0]);
        if (o || PyErr_Occurred())
            return o;
    }
    return not_held(args, nargs, 1);
}

/* The keys of a list or tuple (or any iterable, made a list): a new reference. */
static PyObject *key_sequence(PyObject *keys)
{
    if (PyList_CheckExact(keys) || PyTuple_CheckExact(keys)) {
        Py_INCREF(keys);
        return keys;
    }
    return PySequence_List(keys);
}

/* isdisjoint(keys): no key of keys is held. */
static PyObject *HashMap_isdisjoint(HashMap *m, PyObject *keys)
{
    PyObject *seq = key_sequence(keys);
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t idx[BULK];
    int64_t ks[BULK];
    int ok[BULK];
    for (Py_ssize_t base = 0; base < n; base += BULK) {
        Py_ssize_t c = n - base < BULK ? n - base : BULK;
        for (Py_ssize_t j = 0; j < c; j++) {
            int r = as_key(items[base + j], &ks[j]);
            if (r < 0)
                goto fail;
            ok[j] = r;
            if (r) {
                idx[j] = mix((uint64_t)ks[j]) & m->mask;
                __builtin_prefetch(&m->slots[idx[j]]);
            }
        }
        for (Py_ssize_t j = 0; j < c; j++) {
            int hit;
            if (ok[j]) {
                hit = holds(m, ks[j], NULL);
            } else {
                hit = side_has(m->other, items[base + j]);
                if (hit < 0)
                    goto fail;
            }
            if (hit) {
                Py_DECREF(seq);
                Py_RETURN_FALSE;
            }
        }
    }
    Py_DECREF(seq);
    Py_RETURN_TRUE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* put_all(keys, value): m[k] = value for every k; returns how many keys were new. */
static PyObject *HashMap_put_all(HashMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put_all(keys, value)");
        return NULL;
    }
    int64_t v = 0;
    if (as_value(args[1], &v) < 0)
        return NULL;
    PyObject *seq = key_sequence(args[0]);
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t fresh = 0;
    if (reserve(m, n) < 0)
        goto fail;
    int64_t ks[BULK];
    int ok[BULK];
    for (Py_ssize_t base = 0; base < n; base += BULK) {
        Py_ssize_t c = n - base < BULK ? n - base : BULK;
        for (Py_ssize_t j = 0; j < c; j++) {
            int r = as_key(items[base + j], &ks[j]);
            if (r < 0)
                goto fail;
            ok[j] = r;
            if (r)
                __builtin_prefetch(&m->slots[mix((uint64_t)ks[j]) & m->mask], 1);
        }
        for (Py_ssize_t j = 0; j < c; j++) {
            if (ok[j]) {
                fresh += put(m, ks[j], v);
            } else {
                int added = side_put(&m->other, items[base + j], args[1]);
                if (added < 0)
                    goto fail;
                fresh += added;
            }
        }
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(fresh);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* pop_all(keys): [m.pop(k, None) for k in keys], one call. */
static PyObject *HashMap_pop_all(HashMap *m, PyObject *keys)
{
    PyObject *seq = key_sequence(keys);
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (!out)
        goto fail;
    int64_t ks[BULK];
    int ok[BULK];
    for (Py_ssize_t base = 0; base < n; base += BULK) {
        Py_ssize_t c = n - base < BULK ? n - base : BULK;
        for (Py_ssize_t j = 0; j < c; j++) {
            int r = as_key(items[base + j], &ks[j]);
            if (r < 0)
                goto fail;
            ok[j] = r;
            if (r)
                __builtin_prefetch(&m->slots[mix((uint64_t)ks[j]) & m->mask], 1);
        }
        for (Py_ssize_t j = 0; j < c; j++) {
            PyObject *o;
            int64_t v;
            if (ok[j]) {
                o = take(m, ks[j], &v) ? PyLong_FromLongLong(v) : (Py_INCREF(Py_None), Py_None);
            } else {
                o = side_pop(m->other, items[base + j]);
                if (!o && !PyErr_Occurred())
                    o = (Py_INCREF(Py_None), Py_None);
            }
            if (!o)
                goto fail;
            PyList_SET_ITEM(out, base + j, o);
        }
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* pop_held(keys): the values of the keys held, popped, in the keys' order (a key
 * twice is popped once): what `for k in m.keys() & keys: m.pop(k)` would give. */
static PyObject *HashMap_pop_held(HashMap *m, PyObject *keys)
{
    PyObject *seq = key_sequence(keys);
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(0);
    if (!out)
        goto fail;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t k, v;
        int r = as_key(items[j], &k);
        if (r < 0)
            goto fail;
        PyObject *o = NULL;
        if (r) {
            if (take(m, k, &v) && !(o = PyLong_FromLongLong(v)))
                goto fail;
        } else if (!(o = side_pop(m->other, items[j])) && PyErr_Occurred()) {
            goto fail;
        }
        if (o) {
            int e = PyList_Append(out, o);
            Py_DECREF(o);
            if (e < 0)
                goto fail;
        }
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* put_back(keys, values): m[k] = v for each pair whose v is not None. */
static PyObject *HashMap_put_back(HashMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put_back(keys, values)");
        return NULL;
    }
    PyObject *ks = key_sequence(args[0]);
    if (!ks)
        return NULL;
    PyObject *vs = key_sequence(args[1]);
    if (!vs) {
        Py_DECREF(ks);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ks);
    if (PySequence_Fast_GET_SIZE(vs) != n) {
        PyErr_SetString(PyExc_ValueError, "put_back: keys and values differ in length");
        goto fail;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v = PySequence_Fast_GET_ITEM(vs, j);
        if (v != Py_None && HashMap_ass_subscript(m, PySequence_Fast_GET_ITEM(ks, j), v) < 0)
            goto fail;
    }
    Py_DECREF(ks);
    Py_DECREF(vs);
    Py_RETURN_NONE;
fail:
    Py_DECREF(ks);
    Py_DECREF(vs);
    return NULL;
}

static PyObject *HashMap_clear(HashMap *m, PyObject *unused)
{
    Slot *slots = PyMem_Calloc(MIN_CAPACITY, sizeof(Slot));
    if (!slots)
        return PyErr_NoMemory();
    PyMem_Free(m->slots);
    m->slots = slots;
    m->mask = MIN_CAPACITY - 1;
    m->used = 0;
    m->has_zero = 0;
    Py_CLEAR(m->other);
    Py_RETURN_NONE;
}

/* keys(), values(), items(): lists, made at once (safe to mutate the map over). */
static PyObject *listing(HashMap *m, int what)
{
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
#define EMIT(K, V)                                                                         \
    do {                                                                                   \
        PyObject *o;                                                                       \
        if (what == 0)                                                                     \
            o = PyLong_FromLongLong(K);                                                    \
        else if (what == 1)                                                                \
            o = PyLong_FromLongLong(V);                                                    \
        else                                                                               \
            o = Py_BuildValue("(LL)", (long long)(K), (long long)(V));                     \
        if (!o || PyList_Append(out, o) < 0) {                                             \
            Py_XDECREF(o);                                                                 \
            Py_DECREF(out);                                                                \
            return NULL;                                                                   \
        }                                                                                  \
        Py_DECREF(o);                                                                      \
    } while (0)
    if (m->has_zero)
        EMIT(0, m->zero_value);
    for (uint64_t j = 0; j <= m->mask; j++)
        if (m->slots[j].key)
            EMIT(m->slots[j].key, m->slots[j].value);
#undef EMIT
    if (m->other) {
        PyObject *rest = what == 0 ? PyDict_Keys(m->other)
                         : what == 1 ? PyDict_Values(m->other)
                                     : PyDict_Items(m->other);
        if (!rest) {
            Py_DECREF(out);
            return NULL;
        }
        Py_ssize_t k = PyList_GET_SIZE(out);
        int e = PyList_SetSlice(out, k, k, rest);
        Py_DECREF(rest);
        if (e < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* a new dict of the map's pairs (for comparisons) */
static PyObject *HashMap_as_dict(PyObject *self)
{
    PyObject *items = listing((HashMap *)self, 2);
    if (!items)
        return NULL;
    PyObject *d = PyDict_New();
    for (Py_ssize_t j = 0; d && j < PyList_GET_SIZE(items); j++) {
        PyObject *pair = PyList_GET_ITEM(items, j);
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) < 0)
            Py_CLEAR(d);
    }
    Py_DECREF(items);
    return d;
}

static PyObject *HashMap_keys(HashMap *m, PyObject *unused) { return listing(m, 0); }
static PyObject *HashMap_values(HashMap *m, PyObject *unused) { return listing(m, 1); }
static PyObject *HashMap_items(HashMap *m, PyObject *unused) { return listing(m, 2); }

static PyObject *HashMap_iter(HashMap *m)
{
    PyObject *keys = listing(m, 0);
    if (!keys)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

/* update(mapping or pairs) */
static PyObject *HashMap_update_from(HashMap *m, PyObject *src)
{
    PyObject *pairs = PyMapping_Check(src) && PyObject_HasAttrString(src, "items")
                          ? PyObject_CallMethod(src, "items", NULL)
                          : (Py_INCREF(src), src);
    if (!pairs)
        return NULL;
    PyObject *it = PyObject_GetIter(pairs);
    Py_DECREF(pairs);
    if (!it)
        return NULL;
    PyObject *pair;
    while ((pair = PyIter_Next(it))) {
        PyObject *k, *v;
        if (!PyArg_ParseTuple(pair, "OO:update", &k, &v) || HashMap_ass_subscript(m, k, v) < 0) {
            Py_DECREF(pair);
            Py_DECREF(it);
            return NULL;
        }
        Py_DECREF(pair);
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *HashMap_richcompare(PyObject *self, PyObject *other, int op)
{
    return compare_as_dicts(self, other, op, HashMap_as_dict);
}

static PyObject *HashMap_sizeof(HashMap *m, PyObject *unused)
{
    return PyLong_FromSize_t(sizeof(HashMap) + (size_t)(m->mask + 1) * sizeof(Slot));
}

static PyObject *HashMap_repr(HashMap *m)
{
    return PyUnicode_FromFormat("HashMap(%zd keys)", HashMap_len(m));
}

static PyMethodDef HashMap_methods[] = {
    {"get", (PyCFunction)(void (*)(void))HashMap_get, METH_FASTCALL, "get(key[, default])"},
    {"pop", (PyCFunction)(void (*)(void))HashMap_pop, METH_FASTCALL, "pop(key[, default])"},
    {"isdisjoint", (PyCFunction)HashMap_isdisjoint, METH_O, "no key of keys is held"},
    {"put_all", (PyCFunction)(void (*)(void))HashMap_put_all, METH_FASTCALL,
     "put_all(keys, value): m[k] = value for each k; how many were new"},
    {"pop_all", (PyCFunction)HashMap_pop_all, METH_O, "[m.pop(k, None) for k in keys]"},
    {"pop_held", (PyCFunction)HashMap_pop_held, METH_O,
     "the held keys' values, popped, in the keys' order"},
    {"put_back", (PyCFunction)(void (*)(void))HashMap_put_back, METH_FASTCALL,
     "put_back(keys, values): m[k] = v where v is not None"},
    {"clear", (PyCFunction)HashMap_clear, METH_NOARGS, "remove every key"},
    {"keys", (PyCFunction)HashMap_keys, METH_NOARGS, "the keys, a list"},
    {"values", (PyCFunction)HashMap_values, METH_NOARGS, "the values, a list"},
    {"items", (PyCFunction)HashMap_items, METH_NOARGS, "(key, value) pairs, a list"},
    {"update", (PyCFunction)HashMap_update_from, METH_O, "update(mapping or pairs)"},
    {"__sizeof__", (PyCFunction)HashMap_sizeof, METH_NOARGS, "bytes held"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods HashMap_as_mapping = {
    (lenfunc)HashMap_len,
    (binaryfunc)HashMap_subscript,
    (objobjargproc)HashMap_ass_subscript,
};

static PySequenceMethods HashMap_as_sequence = {
    .sq_contains = (objobjproc)HashMap_contains,
};

static PyTypeObject HashMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvscope.db._hashmap.HashMap",
    .tp_doc = "block hash -> int64, open addressing (see db/_hashmap.c)",
    .tp_basicsize = sizeof(HashMap),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = HashMap_new,
    .tp_init = (initproc)HashMap_init,
    .tp_dealloc = (destructor)HashMap_dealloc,
    .tp_traverse = (traverseproc)HashMap_traverse,
    .tp_clear = (inquiry)HashMap_clear_refs,
    .tp_repr = (reprfunc)HashMap_repr,
    .tp_richcompare = HashMap_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_as_mapping = &HashMap_as_mapping,
    .tp_as_sequence = &HashMap_as_sequence,
    .tp_iter = (getiterfunc)HashMap_iter,
    .tp_methods = HashMap_methods,
};

/* ---- ObjectMap: block hash -> object, in insertion order ------------------------
 *
 * The prefix tree's nodes (db.watch_aggregates._Tree.nodes): every block ever stored,
 * up to 2M, whose oldest leaves are forgotten first, so its order is insertion order,
 * as a dict's. Laid out as CPython's compact dict is, an index of slots over a dense
 * array of entries, keys inline in the entries and half of each key's hash in its
 * index slot (one miss to learn a key is absent, the usual question: a prefill's
 * blocks are new), a whole event's index slots prefetched at once. Deleted entries
 * leave a hole, dropped when the entries are next compacted or grown.
 */

typedef struct {
    uint32_t tag; /* the key's hash, high half: a different key is told apart here */
    uint32_t at;  /* entry index, NO_ENTRY: empty */
} IndexSlot;

#define NO_ENTRY UINT32_MAX

typedef struct {
    int64_t key;
    PyObject *value; /* NULL: deleted */
} Entry;

typedef struct {
    PyObject_HEAD
    IndexSlot *index;
    uint64_t mask;
    Entry *entries;
    Py_ssize_t n_entries; /* used, holes included */
    Py_ssize_t cap_entries;
    Py_ssize_t live;
    uint64_t layout; /* changes when entries move (compaction): iterators check it */
    PyObject *other; /* dict of keys that are not int64, or NULL */
} ObjectMap;

static PyTypeObject ObjectMapType;

static IndexSlot *new_index(uint64_t capacity)
{
    IndexSlot *ix = PyMem_Malloc((size_t)capacity * sizeof(IndexSlot));
    if (!ix)
        return NULL;
    for (uint64_t j = 0; j < capacity; j++)
        ix[j].at = NO_ENTRY;
    return ix;
}

static inline IndexSlot *om_find(ObjectMap *m, int64_t key)
{
    uint64_t h = mix((uint64_t)key);
    uint32_t tag = (uint32_t)(h >> 32);
    uint64_t i = h & m->mask;
    for (;;) {
        IndexSlot *s = &m->index[i];
        if (s->at == NO_ENTRY)
            return NULL;
        if (s->tag == tag && m->entries[s->at].key == key)
            return s;
        i = (i + 1) & m->mask;
    }
}

/* Entries made dense (holes dropped, order kept) in an array of cap_entries, and
 * the index rebuilt at capacity. */
static int om_rebuild(ObjectMap *m, Py_ssize_t cap_entries, uint64_t capacity)
{
    IndexSlot *ix = new_index(capacity);
    if (!ix) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < m->n_entries; j++)
        if (m->entries[j].value)
            m->entries[k++] = m->entries[j];
    m->n_entries = k;
    if (cap_entries != m->cap_entries) {
        Entry *e = PyMem_Realloc(m->entries, (size_t)cap_entries * sizeof(Entry));
        if (!e) {
            PyMem_Free(ix);
            PyErr_NoMemory();
            return -1;
        }
        m->entries = e;
        m->cap_entries = cap_entries;
    }
    PyMem_Free(m->index);
    m->index = ix;
    m->mask = capacity - 1;
    for (Py_ssize_t j = 0; j < k; j++) {
        uint64_t h = mix((uint64_t)m->entries[j].key);
        uint64_t i = h & m->mask;
        while (ix[i].at != NO_ENTRY)
            i = (i + 1) & m->mask;
        ix[i].tag = (uint32_t)(h >> 32);
        ix[i].at = (uint32_t)j;
    }
    m->layout++;
    return 0;
}

/* Room for n more keys: the index at a load of at most 3/4 (8 bytes a slot, so
 * 11-21 bytes a key), rebuilt when it doubles; the entries (16 bytes a key, and the
 * holes) grown by half in place when full, compacted instead when a quarter of
 * them are holes. Growing the entries moves no index: a rebuild is a random write
 * a key, and 2M keys made one at every growth had been most of put_all's time. */
static int om_reserve(ObjectMap *m, Py_ssize_t n)
{
    Py_ssize_t want = m->live + n;
    uint64_t icap = m->mask + 1;
    int rebuild = 0;
    while ((uint64_t)want * 4 > icap * 3) {
        icap *= 2;
        rebuild = 1;
    }
    Py_ssize_t cap = m->cap_entries;
    if (m->n_entries + n > cap) {
        if (m->n_entries - m->live >= cap / 4 && want <= cap - cap / 4) {
            rebuild = 1; /* compacting makes the room */
        } else {
            cap += cap / 2;
            if (cap < m->n_entries + n + 8)
                cap = m->n_entries + n + 8;
            if (cap >= (Py_ssize_t)NO_ENTRY) {
                PyErr_SetString(PyExc_OverflowError,
                                "an ObjectMap holds fewer than 2^32 - 1 entries");
                return -1;
            }
            Entry *e = PyMem_Realloc(m->entries, (size_t)cap * sizeof(Entry));
            if (!e) {
                PyErr_NoMemory();
                return -1;
            }
            m->entries = e;
            m->cap_entries = cap;
        }
    }
    return rebuild ? om_rebuild(m, m->cap_entries, icap) : 0;
}

/* Insert or replace (the value's reference is taken); room must be reserved.
 * Returns 1 if the key is new. *old receives a replaced value to release. */
static inline int om_put(ObjectMap *m, int64_t key, PyObject *value, PyObject **old)
{
    uint64_t h = mix((uint64_t)key);
    uint32_t tag = (uint32_t)(h >> 32);
    uint64_t i = h & m->mask;
    for (;;) {
        IndexSlot *s = &m->index[i];
        if (s->at == NO_ENTRY) {
            Py_ssize_t at = m->n_entries++;
            m->entries[at].key = key;
            m->entries[at].value = value;
            s->tag = tag;
            s->at = (uint32_t)at;
            m->live++;
            return 1;
        }
        if (s->tag == tag && m->entries[s->at].key == key) {
            *old = m->entries[s->at].value;
            m->entries[s->at].value = value;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
}

/* Remove the key if held: returns its value (a reference the caller owns) or NULL. */
static PyObject *om_take(ObjectMap *m, int64_t key)
{
    IndexSlot *s = om_find(m, key);
    if (!s)
        return NULL;
    Entry *e = &m->entries[s->at];
    PyObject *value = e->value;
    e->value = NULL;
    m->live--;
    uint64_t hole = (uint64_t)(s - m->index);
    uint64_t j = hole;
    for (;;) {
        j = (j + 1) & m->mask;
        IndexSlot *t = &m->index[j];
        if (t->at == NO_ENTRY)
            break;
        uint64_t home = mix((uint64_t)m->entries[t->at].key) & m->mask;
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->index[hole] = *t;
            hole = j;
        }
    }
    m->index[hole].at = NO_ENTRY;
    if (m->n_entries == m->live + 1 && m->n_entries - 1 == (Py_ssize_t)(e - m->entries))
        m->n_entries--; /* the newest entry: no hole left */
    return value;
}

static PyObject *ObjectMap_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    ObjectMap *m = (ObjectMap *)type->tp_alloc(type, 0);
    if (!m)
        return NULL;
    m->index = new_index(MIN_CAPACITY);
    m->entries = PyMem_Malloc(8 * sizeof(Entry));
    if (!m->index || !m->entries) {
        Py_DECREF(m);
        return PyErr_NoMemory();
    }
    m->mask = MIN_CAPACITY - 1;
    m->cap_entries = 8;
    return (PyObject *)m;
}

static int ObjectMap_traverse(ObjectMap *m, visitproc visit, void *arg)
{
    for (Py_ssize_t j = 0; j < m->n_entries; j++)
        Py_VISIT(m->entries[j].value);
    Py_VISIT(m->other);
    return 0;
}

static int om_clear_all(ObjectMap *m)
{
    Entry *entries = m->entries;
    Py_ssize_t n = m->n_entries;
    IndexSlot *ix = new_index(MIN_CAPACITY);
    Entry *fresh = PyMem_Malloc(8 * sizeof(Entry));
    if (!ix || !fresh) {
        PyMem_Free(ix);
        PyMem_Free(fresh);
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(m->index);
    m->index = ix;
    m->mask = MIN_CAPACITY - 1;
    m->entries = fresh;
    m->cap_entries = 8;
    m->n_entries = 0;
    m->live = 0;
    m->layout++;
    PyObject *other = m->other;
    m->other = NULL;
    for (Py_ssize_t j = 0; j < n; j++) /* released once the map is consistent */
        Py_XDECREF(entries[j].value);
    PyMem_Free(entries);
    Py_XDECREF(other);
    return 0;
}

static int ObjectMap_tp_clear(ObjectMap *m)
{
    return om_clear_all(m) < 0 ? -1 : 0;
}

static void ObjectMap_dealloc(ObjectMap *m)
{
    PyObject_GC_UnTrack(m);
    if (m->entries)
        for (Py_ssize_t j = 0; j < m->n_entries; j++)
            Py_XDECREF(m->entries[j].value);
    Py_CLEAR(m->other);
    PyMem_Free(m->entries);
    PyMem_Free(m->index);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t ObjectMap_len(ObjectMap *m)
{
    return m->live + side_len(m->other);
}

static int ObjectMap_contains(ObjectMap *m, PyObject *key)
{
    int64_t k;
    int r = as_key(key, &k);
    if (r < 0)
        return -1;
    if (r)
        return om_find(m, k) != NULL;
    return side_has(m->other, key);
}

/* The value (borrowed) or NULL, error set only on a real error. */
static PyObject *om_lookup(ObjectMap *m, PyObject *key)
{
    int64_t k;
    int r = as_key(key, &k);
    if (r < 0)
        return NULL;
    if (r) {
        IndexSlot *s = om_find(m, k);
        return s ? m->entries[s->at].value : NULL;
    }
    return side_get(m->other, key);
}

static PyObject *ObjectMap_subscript(ObjectMap *m, PyObject *key)
{
    PyObject *v = om_lookup(m, key);
    if (v) {
        Py_INCREF(v);
        return v;
    }
    if (!PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, key);
    return NULL;
}

static int ObjectMap_ass_subscript(ObjectMap *m, PyObject *key, PyObject *value)
{
    int64_t k;
    int r = as_key(key, &k);
    if (r < 0)
        return -1;
    if (!value) {
        if (!r)
            return side_del(m->other, key);
        PyObject *old = om_take(m, k);
        if (old) {
            Py_DECREF(old);
            return 0;
        }
        PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    if (!r)
        return side_put(&m->other, key, value) < 0 ? -1 : 0;
    if (om_reserve(m, 1) < 0)
        return -1;
    PyObject *old = NULL;
    Py_INCREF(value);
    om_put(m, k, value, &old);
    Py_XDECREF(old);
    return 0;
}

static PyObject *ObjectMap_get(ObjectMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (key_and_default(nargs, "get(key[, default])") < 0)
        return NULL;
    PyObject *v = om_lookup(m, args[0]);
    if (!v)
        return PyErr_Occurred() ? NULL : not_held(args, nargs, 0);
    Py_INCREF(v);
    return v;
}

static PyObject *ObjectMap_pop(ObjectMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (key_and_default(nargs, "pop(key[, default])") < 0)
        return NULL;
    int64_t k;
    int r = as_key(args[0], &k);
    if (r < 0)
        return NULL;
    PyObject *o = r ? om_take(m, k) : side_pop(m->other, args[0]);
    if (o || PyErr_Occurred())
        return o;
    return not_held(args, nargs, 1);
}

static PyObject *ObjectMap_isdisjoint(ObjectMap *m, PyObject *keys)
{
    PyObject *seq = key_sequence(keys);
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int64_t ks[BULK];
    int ok[BULK];
    for (Py_ssize_t base = 0; base < n; base += BULK) {
        Py_ssize_t c = n - base < BULK ? n - base : BULK;
        for (Py_ssize_t j = 0; j < c; j++) {
            int r = as_key(items[base + j], &ks[j]);
            if (r < 0)
                goto fail;
            ok[j] = r;
            if (r)
                __builtin_prefetch(&m->index[mix((uint64_t)ks[j]) & m->mask]);
        }
        for (Py_ssize_t j = 0; j < c; j++) {
            int hit;
            if (ok[j]) {
                hit = om_find(m, ks[j]) != NULL;
            } else {
                hit = side_has(m->other, items[base + j]);
                if (hit < 0)
                    goto fail;
            }
            if (hit) {
                Py_DECREF(seq);
                Py_RETURN_FALSE;
            }
        }
    }
    Py_DECREF(seq);
    Py_RETURN_TRUE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* put_all(keys, value): m[k] = value for each k, in order; how many were new. */
static PyObject *ObjectMap_put_all(ObjectMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put_all(keys, value)");
        return NULL;
    }
    PyObject *value = args[1];
    PyObject *seq = key_sequence(args[0]);
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t fresh = 0;
    if (om_reserve(m, n) < 0)
        goto fail;
    int64_t ks[BULK];
    int ok[BULK];
    for (Py_ssize_t base = 0; base < n; base += BULK) {
        Py_ssize_t c = n - base < BULK ? n - base : BULK;
        for (Py_ssize_t j = 0; j < c; j++) {
            int r = as_key(items[base + j], &ks[j]);
            if (r < 0)
                goto fail;
            ok[j] = r;
            if (r)
                __builtin_prefetch(&m->index[mix((uint64_t)ks[j]) & m->mask], 1);
        }
        for (Py_ssize_t j = 0; j < c; j++) {
            if (ok[j]) {
                PyObject *old = NULL;
                Py_INCREF(value);
                fresh += om_put(m, ks[j], value, &old);
                Py_XDECREF(old);
            } else {
                int added = side_put(&m->other, items[base + j], value);
                if (added < 0)
                    goto fail;
                fresh += added;
            }
        }
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(fresh);
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *ObjectMap_clear(ObjectMap *m, PyObject *unused)
{
    if (om_clear_all(m) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- iteration: keys, values or items, in insertion order ---- */

typedef struct {
    PyObject_HEAD
    ObjectMap *map;
    Py_ssize_t pos;
    uint64_t layout;
    int what; /* 0 keys, 1 values, 2 items */
    PyObject *rest; /* iterator over the side dict's, once the table is done */
} ObjectMapIter;

static PyTypeObject ObjectMapIterType;

static PyObject *om_iter(ObjectMap *m, int what)
{
    ObjectMapIter *it = PyObject_GC_New(ObjectMapIter, &ObjectMapIterType);
    if (!it)
        return NULL;
    Py_INCREF(m);
    it->map = m;
    it->pos = 0;
    it->layout = m->layout;
    it->what = what;
    it->rest = NULL;
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

static PyObject *ObjectMapIter_next(ObjectMapIter *it)
{
    ObjectMap *m = it->map;
    if (!m)
        return NULL;
    if (!it->rest) {
        if (it->layout != m->layout) {
            PyErr_SetString(PyExc_RuntimeError, "ObjectMap changed size during iteration");
            return NULL;
        }
        while (it->pos < m->n_entries) {
            Entry *e = &m->entries[it->pos++];
            if (!e->value)
                continue;
            if (it->what == 0)
                return PyLong_FromLongLong(e->key);
            if (it->what == 1) {
                Py_INCREF(e->value);
                return e->value;
            }
            PyObject *k = PyLong_FromLongLong(e->key);
            if (!k)
                return NULL;
            PyObject *pair = PyTuple_Pack(2, k, e->value);
            Py_DECREF(k);
            return pair;
        }
        if (!m->other || !PyDict_GET_SIZE(m->other)) {
            Py_CLEAR(it->map);
            return NULL;
        }
        PyObject *view = it->what == 0 ? PyDict_Keys(m->other)
                         : it->what == 1 ? PyDict_Values(m->other)
                                         : PyDict_Items(m->other);
        if (!view)
            return NULL;
        it->rest = PyObject_GetIter(view);
        Py_DECREF(view);
        if (!it->rest)
            return NULL;
    }
    PyObject *o = PyIter_Next(it->rest);
    if (!o)
        Py_CLEAR(it->map);
    return o;
}

static int ObjectMapIter_traverse(ObjectMapIter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->map);
    Py_VISIT(it->rest);
    return 0;
}

static void ObjectMapIter_dealloc(ObjectMapIter *it)
{
    PyObject_GC_UnTrack(it);
    Py_XDECREF(it->map);
    Py_XDECREF(it->rest);
    PyObject_GC_Del(it);
}

static PyTypeObject ObjectMapIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvscope.db._hashmap.ObjectMapIterator",
    .tp_basicsize = sizeof(ObjectMapIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)ObjectMapIter_dealloc,
    .tp_traverse = (traverseproc)ObjectMapIter_traverse,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)ObjectMapIter_next,
};

static PyObject *ObjectMap_iter(ObjectMap *m) { return om_iter(m, 0); }
static PyObject *ObjectMap_keys(ObjectMap *m, PyObject *unused) { return om_iter(m, 0); }
static PyObject *ObjectMap_values(ObjectMap *m, PyObject *unused) { return om_iter(m, 1); }
static PyObject *ObjectMap_items(ObjectMap *m, PyObject *unused) { return om_iter(m, 2); }

/* a new dict of the map's pairs (for comparisons) */
static PyObject *ObjectMap_as_dict(PyObject *self)
{
    PyObject *d = PyDict_New();
    PyObject *it = d ? om_iter((ObjectMap *)self, 2) : NULL, *pair;
    if (!it) {
        Py_XDECREF(d);
        return NULL;
    }
    while ((pair = PyIter_Next(it))) {
        int e = PyDict_SetItem(d, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
        Py_DECREF(pair);
        if (e < 0)
            break;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        Py_CLEAR(d);
    return d;
}

static PyObject *ObjectMap_richcompare(PyObject *self, PyObject *other, int op)
{
    return compare_as_dicts(self, other, op, ObjectMap_as_dict);
}

static PyObject *ObjectMap_sizeof(ObjectMap *m, PyObject *unused)
{
    return PyLong_FromSize_t(sizeof(ObjectMap) + (size_t)(m->mask + 1) * sizeof(IndexSlot) +
                             (size_t)m->cap_entries * sizeof(Entry));
}

static PyObject *ObjectMap_repr(ObjectMap *m)
{
    return PyUnicode_FromFormat("ObjectMap(%zd keys)", ObjectMap_len(m));
}

static PyMethodDef ObjectMap_methods[] = {
    {"get", (PyCFunction)(void (*)(void))ObjectMap_get, METH_FASTCALL, "get(key[, default])"},
    {"pop", (PyCFunction)(void (*)(void))ObjectMap_pop, METH_FASTCALL, "pop(key[, default])"},
    {"isdisjoint", (PyCFunction)ObjectMap_isdisjoint, METH_O, "no key of keys is held"},
    {"put_all", (PyCFunction)(void (*)(void))ObjectMap_put_all, METH_FASTCALL,
     "put_all(keys, value): m[k] = value for each k; how many were new"},
    {"clear", (PyCFunction)ObjectMap_clear, METH_NOARGS, "remove every key"},
    {"keys", (PyCFunction)ObjectMap_keys, METH_NOARGS, "an iterator of the keys, oldest first"},
    {"values", (PyCFunction)ObjectMap_values, METH_NOARGS, "an iterator of the values"},
    {"items", (PyCFunction)ObjectMap_items, METH_NOARGS, "an iterator of (key, value) pairs"},
    {"__sizeof__", (PyCFunction)ObjectMap_sizeof, METH_NOARGS, "bytes held"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods ObjectMap_as_mapping = {
    (lenfunc)ObjectMap_len,
    (binaryfunc)ObjectMap_subscript,
    (objobjargproc)ObjectMap_ass_subscript,
};

static PySequenceMethods ObjectMap_as_sequence = {
    .sq_contains = (objobjproc)ObjectMap_contains,
};

static PyTypeObject ObjectMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvscope.db._hashmap.ObjectMap",
    .tp_doc = "block hash -> object, insertion-ordered (see db/_hashmap.c)",
    .tp_basicsize = sizeof(ObjectMap),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = ObjectMap_new,
    .tp_dealloc = (destructor)ObjectMap_dealloc,
    .tp_traverse = (traverseproc)ObjectMap_traverse,
    .tp_clear = (inquiry)ObjectMap_tp_clear,
    .tp_repr = (reprfunc)ObjectMap_repr,
    .tp_richcompare = ObjectMap_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_as_mapping = &ObjectMap_as_mapping,
    .tp_as_sequence = &ObjectMap_as_sequence,
    .tp_iter = (getiterfunc)ObjectMap_iter,
    .tp_methods = ObjectMap_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hashmap", "Block hash maps for the watch fold (db/hashmap.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__hashmap(void)
{
    if (PyType_Ready(&HashMapType) < 0 || PyType_Ready(&ObjectMapType) < 0 ||
        PyType_Ready(&ObjectMapIterType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (!mod)
        return NULL;
    Py_INCREF(&HashMapType);
    if (PyModule_AddObject(mod, "HashMap", (PyObject *)&HashMapType) < 0) {
        Py_DECREF(&HashMapType);
        Py_DECREF(mod);
        return NULL;
    }
    Py_INCREF(&ObjectMapType);
    if (PyModule_AddObject(mod, "ObjectMap", (PyObject *)&ObjectMapType) < 0) {
        Py_DECREF(&ObjectMapType);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
