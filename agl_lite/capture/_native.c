/* The capture path's byte scans in C: agl_lite/capture/native.py holds the same three functions in Python, and
 * tests/capture/test_native.py checks that both give the same answer on every fixture and on generated input.
 *
 * Each function only reads its arguments and builds new bytes; every index is checked against the length it
 * indexes. Python slicing never fails (a slice past the end is empty); where the Python code slices, the C code
 * tests that the range is not empty rather than trusting that the bytes make it so.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* The first `needle` in `s[start:n]`, as an offset into s; -1 when none. */
static Py_ssize_t
find_at(const char *s, Py_ssize_t n, const char *needle, Py_ssize_t m, Py_ssize_t start)
{
    if (start < 0 || start > n || n - start < m) {
        return -1;
    }
    if (m == 0) {
        return start;
    }
    const char *p = memmem(s + start, (size_t)(n - start), needle, (size_t)m);
    return p == NULL ? -1 : p - s;
}

/* The first `needle` (m >= 1 bytes) in `s[start:n]`, for haystacks too short to pay memmem's setup: memchr for
 * its first byte, memcmp for the rest; after 16 false starts, memmem (linear whatever the bytes). */
static Py_ssize_t
find_short(const char *s, Py_ssize_t n, const char *needle, Py_ssize_t m, Py_ssize_t start)
{
    for (int tries = 0; start >= 0 && start <= n - m; tries++) {
        if (tries == 16) {
            return find_at(s, n, needle, m, start);
        }
        const char *p = memchr(s + start, needle[0], (size_t)(n - m - start + 1));
        if (p == NULL) {
            return -1;
        }
        if (memcmp(p, needle, (size_t)m) == 0) {
            return p - s;
        }
        start = p - s + 1;
    }
    return -1;
}

static int
arg_count(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs == expected) {
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, expected, nargs);
    return 0;
}

static int
bytes_arg(PyObject *arg, const char *name)
{
    if (PyBytes_Check(arg)) {
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.100s", name, Py_TYPE(arg)->tp_name);
    return 0;
}

/* find(data, needle) -> int: data.find(needle), through memmem. */
static PyObject *
find(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!arg_count("find", nargs, 2) || !bytes_arg(args[0], "data")
        || !bytes_arg(args[1], "needle")) {
        return NULL;
    }
    return PyLong_FromSsize_t(find_at(PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]),
                                      PyBytes_AS_STRING(args[1]), PyBytes_GET_SIZE(args[1]), 0));
}

static const char IDS_KEY[] = "token_ids\":[";
#define IDS_KEY_LEN ((Py_ssize_t)(sizeof(IDS_KEY) - 1))
static const char IDS_NULL[] = "token_ids\":null";
#define IDS_NULL_LEN ((Py_ssize_t)(sizeof(IDS_NULL) - 1))

/* The start of the first `token_ids":[` whose `[` lies in s[from:n]; -1 when none. Found by its `[`, rarer in JSON
 * than the key's other bytes, with memchr; where `[` is dense (16 false starts in a row), with memmem, whose cost
 * does not grow with the number of `[`. */
static Py_ssize_t
next_ids_key(const char *s, Py_ssize_t n, Py_ssize_t from)
{
    for (int misses = 0; from < n; misses++) {
        if (misses == 16) {
            /* The key holds one `[`, its last byte: a key whose `[` is at or after `from` starts at or after
             * from - (IDS_KEY_LEN - 1), and none that starts there has its `[` before `from`. */
            Py_ssize_t start = from - (IDS_KEY_LEN - 1);
            return find_at(s, n, IDS_KEY, IDS_KEY_LEN, start < 0 ? 0 : start);
        }
        const char *p = memchr(s + from, '[', (size_t)(n - from));
        if (p == NULL) {
            return -1;
        }
        Py_ssize_t at = p + 1 - s - IDS_KEY_LEN;
        if (at >= 0 && memcmp(s + at, IDS_KEY, (size_t)IDS_KEY_LEN) == 0) {
            return at;
        }
        from = p + 1 - s;
    }
    return -1;
}

/* Whether the `token_ids":[` at `at` is the key `token_ids` or `prompt_token_ids` of an object member: what the
 * regex's two lookbehinds say, `[{,]"token_ids":[` and `[{,]"prompt_token_ids":[`. */
static int
ids_key(const char *s, Py_ssize_t at)
{
    if (at >= 2 && s[at - 1] == '"' && (s[at - 2] == '{' || s[at - 2] == ',')) {
        return 1;
    }
    return at >= 9 && memcmp(s + at - 8, "\"prompt_", 8) == 0 && (s[at - 9] == '{' || s[at - 9] == ',');
}

/* The end (past the `]`) of the id array whose `[` ends at `from`; -1 when `[0-9,]*]` does not follow. */
static Py_ssize_t
ids_end(const char *s, Py_ssize_t n, Py_ssize_t from)
{
    Py_ssize_t e = from;
    while (e < n && ((s[e] >= '0' && s[e] <= '9') || s[e] == ',')) {
        e++;
    }
    return e < n && s[e] == ']' ? e + 1 : -1;
}

/* strip_ids(data) -> bytes: capture/native.py's regex substitution, every `token_ids` and `prompt_token_ids`
 * array of digits and commas that is an object member becomes null. `data` itself when nothing matches. */
static PyObject *
strip_ids(PyObject *module, PyObject *data)
{
    if (!bytes_arg(data, "data")) {
        return NULL;
    }
    const char *s = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    PyObject *out = NULL;
    char *o = NULL;
    Py_ssize_t w = 0;      /* bytes written to out */
    Py_ssize_t copied = 0; /* s[:copied] is in out */
    for (Py_ssize_t at = next_ids_key(s, n, 0); at >= 0;) {
        Py_ssize_t end = at >= copied && ids_key(s, at) ? ids_end(s, n, at + IDS_KEY_LEN) : -1;
        if (end < 0) {
            at = next_ids_key(s, n, at + IDS_KEY_LEN);
            continue;
        }
        if (out == NULL) {
            /* A match takes at least 13 bytes (`token_ids":[]`) and writes 15: at most 2 more per 13. */
            Py_ssize_t bound = n + 2 * (n / 13) + 2;
            out = PyBytes_FromStringAndSize(NULL, bound);
            if (out == NULL) {
                return NULL;
            }
            o = PyBytes_AS_STRING(out);
        }
        memcpy(o + w, s + copied, (size_t)(at - copied));
        w += at - copied;
        memcpy(o + w, IDS_NULL, (size_t)IDS_NULL_LEN);
        w += IDS_NULL_LEN;
        copied = end;
        at = next_ids_key(s, n, end);
    }
    if (out == NULL) {
        return Py_NewRef(data);
    }
    memcpy(o + w, s + copied, (size_t)(n - copied));
    w += n - copied;
    if (_PyBytes_Resize(&out, w) < 0) {
        return NULL;
    }
    return out;
}

/* A growing JSON array of byte strings, `[a,b,...]`. */
typedef struct {
    char *buf;
    Py_ssize_t len;
    Py_ssize_t cap;
    Py_ssize_t items;
} Array;

static int
array_add(Array *a, const char *s, Py_ssize_t n)
{
    Py_ssize_t need = a->len + n + 2; /* the separator (or `[`) now, the closing `]` later */
    if (need > a->cap) {
        Py_ssize_t cap = a->cap ? a->cap : 256;
        while (cap < need) {
            if (cap > PY_SSIZE_T_MAX / 2) {
                PyErr_NoMemory();
                return -1;
            }
            cap *= 2;
        }
        char *buf = PyMem_Realloc(a->buf, (size_t)cap);
        if (buf == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        a->buf = buf;
        a->cap = cap;
    }
    a->buf[a->len++] = a->items++ ? ',' : '[';
    memcpy(a->buf + a->len, s, (size_t)n);
    a->len += n;
    return 0;
}

/* The array's JSON (`[]` when empty); the array is emptied for the next run. */
static PyObject *
array_take(Array *a)
{
    PyObject *out;
    if (a->items == 0) {
        out = PyBytes_FromStringAndSize("[]", 2);
    } else {
        a->buf[a->len++] = ']';
        out = PyBytes_FromStringAndSize(a->buf, a->len);
    }
    a->len = 0;
    a->items = 0;
    return out;
}

/* Appends the run of text deltas gathered so far, if any, to `steps` as (texts JSON, ids JSON). */
static int
flush_run(PyObject *steps, Array *texts, Array *ids)
{
    if (texts->items == 0) {
        return 0;
    }
    PyObject *t = array_take(texts);
    PyObject *i = array_take(ids);
    PyObject *run = (t && i) ? PyTuple_Pack(2, t, i) : NULL;
    Py_XDECREF(t);
    Py_XDECREF(i);
    if (run == NULL) {
        return -1;
    }
    int rc = PyList_Append(steps, run);
    Py_DECREF(run);
    return rc;
}

static const char SEP[] = "\n\ndata: ";
#define SEP_LEN ((Py_ssize_t)(sizeof(SEP) - 1))
static const char TAIL[] = "\"},\"logprobs\":null,\"finish_reason\":null,\"token_ids\":[";
#define TAIL_LEN ((Py_ssize_t)(sizeof(TAIL) - 1))

/* text_runs(data, lead) -> (steps, others, parts) | None: capture/native.py's `text_runs`, which says what
 * it computes. */
static PyObject *
text_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!arg_count("text_runs", nargs, 2) || !bytes_arg(args[0], "data") || !bytes_arg(args[1], "lead")) {
        return NULL;
    }
    const char *s = PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    const char *lead = PyBytes_AS_STRING(args[1]);
    Py_ssize_t lead_len = PyBytes_GET_SIZE(args[1]);
    if (lead_len < 1 || lead[lead_len - 1] != '"') {
        PyErr_SetString(PyExc_ValueError, "lead must end with a quote");
        return NULL;
    }
    if (n < 8 || memcmp(s, "data: ", 6) != 0 || memcmp(s + n - 2, "\n\n", 2) != 0) {
        Py_RETURN_NONE;
    }
    PyObject *steps = PyList_New(0);
    if (steps == NULL) {
        return NULL;
    }
    Array texts = {0}, ids = {0};
    Py_ssize_t others = 0, parts = 0;
    Py_ssize_t stop = n - 2; /* the events are `data[6:-2].split(b"\n\ndata: ")` */
    Py_ssize_t a = 6;
    int fallback = 0;
    while (!fallback) {
        Py_ssize_t b = find_short(s, stop, SEP, SEP_LEN, a);
        Py_ssize_t next = b + SEP_LEN;
        if (b < 0) {
            b = stop;
        }
        const char *ev = s + a;
        Py_ssize_t len = b - a;
        parts++;
        if (len >= lead_len && memcmp(ev, lead, (size_t)lead_len) == 0 && len >= 4
            && memcmp(ev + len - 4, "]}]}", 4) == 0) {
            /* The text is ev[lead_len - 1 : j + 1], quotes included, j being the last TAIL: one JSON string
             * when those two are its only quotes and the closing one is not escaped. Both ends are quotes (the
             * lead's last byte, TAIL's first), so j must be the first quote after the lead, and TAIL must start
             * there and nowhere after: the quote after the lead is all there is to try. */
            const char *q = memchr(ev + lead_len, '"', (size_t)(len - lead_len));
            Py_ssize_t j = q == NULL ? -1 : q - ev;
            if (j >= 0 && len - j >= TAIL_LEN && memcmp(ev + j, TAIL, (size_t)TAIL_LEN) == 0
                && find_short(ev, len, TAIL, TAIL_LEN, j + 1) < 0) {
                const char *text = ev + lead_len - 1;
                Py_ssize_t text_len = j + 2 - lead_len;
                if (ev[j - 1] != '\\') {
                    Py_ssize_t id_start = j + TAIL_LEN, id_stop = len - 4;
                    if (array_add(&texts, text, text_len) < 0
                        || (id_stop > id_start && array_add(&ids, ev + id_start, id_stop - id_start) < 0)) {
                        goto error;
                    }
                    goto next_event;
                }
            }
        }
        if (flush_run(steps, &texts, &ids) < 0) {
            goto error;
        }
        if (len == 6 && memcmp(ev, "[DONE]", 6) == 0) {
            if (PyList_Append(steps, Py_None) < 0) {
                goto error;
            }
        } else if (memchr(ev, '\n', (size_t)len) != NULL) {
            fallback = 1; /* not one data line: comments, other fields, multi-line data */
        } else {
            PyObject *item = PyBytes_FromStringAndSize(ev, len);
            if (item == NULL || PyList_Append(steps, item) < 0) {
                Py_XDECREF(item);
                goto error;
            }
            Py_DECREF(item);
            others++;
        }
    next_event:
        if (b == stop) {
            break;
        }
        a = next;
    }
    if (!fallback && flush_run(steps, &texts, &ids) < 0) {
        goto error;
    }
    PyMem_Free(texts.buf);
    PyMem_Free(ids.buf);
    if (fallback) {
        Py_DECREF(steps);
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(Nnn)", steps, others, parts);
error:
    PyMem_Free(texts.buf);
    PyMem_Free(ids.buf);
    Py_DECREF(steps);
    return NULL;
}

static PyMethodDef methods[] = {
    {"find", (PyCFunction)(void (*)(void))find, METH_FASTCALL, "data.find(needle), through memmem."},
    {"strip_ids", strip_ids, METH_O, "Every token-id array member of `data` as null."},
    {"text_runs", (PyCFunction)(void (*)(void))text_runs, METH_FASTCALL, "A chat stream's text-delta runs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "agl_lite.capture._native",
    .m_doc = "The capture path's byte scans in C.",
    .m_size = 0,
    .m_methods = methods,
};

#ifndef AGL_NATIVE_SOURCE_SHA256
#define AGL_NATIVE_SOURCE_SHA256 "" /* built by hand, not by setup.py: no digest */
#endif

PyMODINIT_FUNC
PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_SHA256", AGL_NATIVE_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
