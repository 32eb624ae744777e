/*
 * forestflow.predlog._jsonl: the file log's JSON line of the usual event, in one call.
 *
 * Nearly every logged request is a /score answer with its JSON bodies, a V2 REST one with its wire
 * bodies, or a GraphPipe one with its flatbuffers. Their line is a fixed frame around the bodies as they were on the wire; orjson built it
 * from a dict display of Fragments, growing its buffer while copying each body (kilobytes at 100
 * rows) more than once. Here every piece is sized first and copied once into the line's bytes:
 *
 *   score: {"topic":"basic","key":K,"event":{"prediction":RESPONSE,"servedRequest":B,
 *           "inferenceRequest":REQUEST,"loggingSettings":L,"eventTimeMS":"T","requestId":R,
 *           "fqrv":F,"latencyMs":X,"status":S,"protocol":P}}
 *   v2:    {"topic":"basic","key":K,"event":{"servedRequest":B,"loggingSettings":L,"eventTimeMS":"T",
 *           "requestId":R,"fqrv":F,"latencyMs":X,"status":S,"protocol":"v2","wireRequest":REQUEST,
 *           "wireResponse":RESPONSE}}
 *   graphpipe: {"topic":"graphpipe","key":K,"event":{"prediction":{"inferResponse":"B64(RESPONSE)","fqrv":F},
 *           "servedRequest":B,"inferBytes":"B64(REQUEST)","loggingSettings":L,"eventTimeMS":"T","requestId":R,
 *           "fqrv":F,"latencyMs":X,"status":S,"protocol":P}}
 *
 * exactly the bytes orjson writes for the same dict (tests/predlog compares them). A GraphPipe event's
 * flatbuffers are written as base64 (the standard alphabet, padded: what base64.b64encode gives) straight
 * into the line, with AVX2 or SSSE3 where the CPU has them: binascii's encoder costs ~17 instructions a
 * byte, then its text was decoded to a str and copied again by orjson (kilobytes at 100 rows). The JSON
 * bodies have CR and LF turned into spaces (encode.one_line_json); the latency comes written by orjson
 * (its shortest float form: Python's repr() costs 5-7k instructions for a 17-digit latency). None, so
 * the caller builds the line with orjson, whenever this writer could differ from orjson: a text that
 * needs escaping (a quote, a backslash, a control character) or is not valid UTF-8.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "pylong.h"

/* A str that JSON needs no escape for, as its UTF-8; NULL (no exception set) otherwise. */
static const char *plain_text(PyObject *text, Py_ssize_t *len) {
    const char *data;
    if (!PyUnicode_Check(text))
        return NULL;
    if (PyUnicode_IS_COMPACT_ASCII(text)) {
        *len = PyUnicode_GET_LENGTH(text);
        data = (const char *)PyUnicode_DATA(text);
    } else if ((data = PyUnicode_AsUTF8AndSize(text, len)) == NULL) { /* lone surrogates: orjson refuses them */
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *len; i++) {
        unsigned char c = (unsigned char)data[i];
        if (c < 0x20 || c == '"' || c == '\\')
            return NULL;
    }
    return data;
}

/* A body's bytes (a bytes object or a subclass: WireBody); NULL (no exception set) for anything else. */
static const char *body_of(PyObject *body, Py_ssize_t *len) {
    if (!PyBytes_Check(body))
        return NULL;
    *len = PyBytes_GET_SIZE(body);
    return PyBytes_AS_STRING(body);
}

/* Copies a body with CR and LF as spaces (in valid JSON they can only be whitespace between tokens). */
static char *put_body(char *out, const char *body, Py_ssize_t len) {
    memcpy(out, body, (size_t)len);
    if (memchr(body, '\n', (size_t)len) != NULL || memchr(body, '\r', (size_t)len) != NULL)
        for (Py_ssize_t i = 0; i < len; i++)
            if (out[i] == '\n' || out[i] == '\r')
                out[i] = ' ';
    return out + len;
}

static char *put(char *out, const char *text, Py_ssize_t len) {
    memcpy(out, text, (size_t)len);
    return out + len;
}

/* A 64-bit integer in decimal (snprintf costs more than the rest of a 1-row line); returns its length. */
static Py_ssize_t decimal(char *buf, long long value) {
    char digits[24];
    unsigned long long v = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    Py_ssize_t n = 0, len = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    if (value < 0)
        buf[len++] = '-';
    while (n > 0)
        buf[len++] = digits[--n];
    return len;
}

#define PUT_LITERAL(out, literal) put((out), (literal), (Py_ssize_t)(sizeof(literal) - 1))

static const char BASE64_ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
/* The two base64 characters of every 12-bit value, in memory order (filled at import). */
static char base64_pairs[4096][2];

static void fill_base64_pairs(void) {
    for (int i = 0; i < 4096; i++) {
        base64_pairs[i][0] = BASE64_ALPHABET[i >> 6];
        base64_pairs[i][1] = BASE64_ALPHABET[i & 63];
    }
}

/* Length of the padded base64 text of ``len`` bytes (len below PY_SSIZE_T_MAX / 2, checked by the caller). */
static Py_ssize_t base64_len(Py_ssize_t len) { return (len + 2) / 3 * 4; }

/* Eight bytes as a big-endian number. */
static inline uint64_t load_be64(const unsigned char *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && defined(__GNUC__)
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
#else
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
#endif
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define BASE64_SIMD 1
/* What base64 is written with: 0 the plain loop, 1 SSSE3, 2 AVX2 then SSSE3 (the CPU's best, set at import). */
static int simd_level = 0;

static int cpu_simd_level(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 2 : __builtin_cpu_supports("ssse3") ? 1 : 0;
}

/* The base64 text of ``len`` bytes, twelve bytes (sixteen characters) a step with SSSE3 while sixteen can
 * be read; returns how many bytes it wrote the text of (a multiple of 3), ``*out`` moved past that text.
 *
 * Each 32-bit lane takes one 3-byte group a, b, c as bytes (b, a, c, b): its low 16-bit word is then
 * a << 8 | b, holding the first index in bits 15-10 and the second in bits 9-4, its high word b << 8 | c,
 * holding the third in bits 11-6 and the fourth in bits 5-0. A high-half multiply by 64 (low word) and
 * 1024 (high word) brings the first and third down to bits 0-5 of their word; a low-half multiply by 16
 * and 256 brings the second and fourth up to bits 8-13: each byte of the lane is then one index. An index
 * becomes its character by an offset: 'A' for 0-25, 'a' - 26 for 26-51, '0' - 52 for 52-61, and
 * '+' - 62 and '/' - 63 for the last two, picked from a 16-entry table by pshufb. */
__attribute__((target("ssse3"))) static Py_ssize_t put_base64_ssse3(char **out, const unsigned char *in, Py_ssize_t len) {
    const __m128i spread = _mm_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
    const __m128i first_third = _mm_set1_epi32(0x0FC0FC00), first_third_shift = _mm_set1_epi32(0x04000040);
    const __m128i second_fourth = _mm_set1_epi32(0x003F03F0), second_fourth_shift = _mm_set1_epi32(0x01000010);
    const __m128i offsets = _mm_setr_epi8('a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                          '0' - 52, '0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0);
    char *o = *out;
    Py_ssize_t i = 0;
    for (; len - i >= 16; i += 12, o += 16) {
        __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(in + i)), spread);
        __m128i indices = _mm_or_si128(_mm_mulhi_epu16(_mm_and_si128(v, first_third), first_third_shift),
                                       _mm_mullo_epi16(_mm_and_si128(v, second_fourth), second_fourth_shift));
        /* 0 for indices 0-51, 1-12 for 52-63; then 13 for 0-25: the offsets' entry of each index */
        __m128i entry = _mm_subs_epu8(indices, _mm_set1_epi8(51));
        entry = _mm_or_si128(entry, _mm_and_si128(_mm_cmpgt_epi8(_mm_set1_epi8(26), indices), _mm_set1_epi8(13)));
        _mm_storeu_si128((__m128i *)(void *)o, _mm_add_epi8(indices, _mm_shuffle_epi8(offsets, entry)));
    }
    *out = o;
    return i;
}

/* put_base64_ssse3() with AVX2: two 12-byte groups a step, one per 128-bit lane (the same lane-wise
 * operations), while 28 bytes can be read (the second lane's load reads 16 from the step's 12th). */
__attribute__((target("avx2"))) static Py_ssize_t put_base64_avx2(char **out, const unsigned char *in, Py_ssize_t len) {
    const __m256i spread = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10, 1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8,
                                            7, 10, 9, 11, 10);
    const __m256i first_third = _mm256_set1_epi32(0x0FC0FC00), first_third_shift = _mm256_set1_epi32(0x04000040);
    const __m256i second_fourth = _mm256_set1_epi32(0x003F03F0), second_fourth_shift = _mm256_set1_epi32(0x01000010);
    const __m256i offsets = _mm256_setr_epi8('a' - 26, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                             '0' - 52, '0' - 52, '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0, 'a' - 26, '0' - 52,
                                             '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52, '0' - 52,
                                             '0' - 52, '+' - 62, '/' - 63, 'A', 0, 0);
    char *o = *out;
    Py_ssize_t i = 0;
    for (; len - i >= 28; i += 24, o += 32) {
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(in + i))),
                                            _mm_loadu_si128((const __m128i *)(const void *)(in + i + 12)), 1);
        __m256i indices;
        __m256i entry;
        v = _mm256_shuffle_epi8(v, spread);
        indices = _mm256_or_si256(_mm256_mulhi_epu16(_mm256_and_si256(v, first_third), first_third_shift),
                                  _mm256_mullo_epi16(_mm256_and_si256(v, second_fourth), second_fourth_shift));
        entry = _mm256_subs_epu8(indices, _mm256_set1_epi8(51));
        entry = _mm256_or_si256(entry, _mm256_and_si256(_mm256_cmpgt_epi8(_mm256_set1_epi8(26), indices), _mm256_set1_epi8(13)));
        _mm256_storeu_si256((__m256i *)(void *)o, _mm256_add_epi8(indices, _mm256_shuffle_epi8(offsets, entry)));
    }
    *out = o;
    return i;
}
#endif

/* Writes ``len`` bytes as padded standard base64; returns the end. Twenty-four bytes a step with AVX2, then
 * twelve with SSSE3, then six (four 12-bit pairs) while eight can be read, then three at a time, then the
 * padded rest. */
static char *put_base64(char *out, const unsigned char *in, Py_ssize_t len) {
    Py_ssize_t i = 0;
#ifdef BASE64_SIMD
    if (simd_level >= 2)
        i = put_base64_avx2(&out, in, len);
    if (simd_level >= 1)
        i += put_base64_ssse3(&out, in + i, len - i);
#endif
    for (; len - i >= 8; i += 6, out += 8) {
        uint64_t v = load_be64(in + i);
        memcpy(out, base64_pairs[(v >> 52) & 0xFFF], 2);
        memcpy(out + 2, base64_pairs[(v >> 40) & 0xFFF], 2);
        memcpy(out + 4, base64_pairs[(v >> 28) & 0xFFF], 2);
        memcpy(out + 6, base64_pairs[(v >> 16) & 0xFFF], 2);
    }
    for (; len - i >= 3; i += 3, out += 4) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        memcpy(out, base64_pairs[v >> 12], 2);
        memcpy(out + 2, base64_pairs[v & 0xFFF], 2);
    }
    if (len - i == 1) {
        out[0] = BASE64_ALPHABET[in[i] >> 2];
        out[1] = BASE64_ALPHABET[(in[i] & 3) << 4];
        out[2] = out[3] = '=';
        out += 4;
    } else if (len - i == 2) {
        out[0] = BASE64_ALPHABET[in[i] >> 2];
        out[1] = BASE64_ALPHABET[(in[i] & 3) << 4 | in[i + 1] >> 4];
        out[2] = BASE64_ALPHABET[(in[i + 1] & 15) << 2];
        out[3] = '=';
        out += 4;
    }
    return out;
}

PyDoc_STRVAR(usual_line_doc,
"usual_line(kind, key, request, response, served, logging_json, event_time_ms, request_id, fqrv_json,\n"
"           latency_ms, status, protocol) -> bytes or None\n\n"
"The JSON line (no newline) of a /score event (``kind`` 0 or False: ``request`` and ``response`` are the\n"
"request body and the Prediction JSON), of a V2 REST event (1 or True: the wire bodies, and ``protocol``\n"
"is written as \"v2\") or of a GraphPipe event (2: the request's and the answer's flatbuffers, written as\n"
"base64). ``key`` is a str or None; ``logging_json`` and ``fqrv_json`` are JSON bytes written as they are,\n"
"and so is ``latency_ms``, the latency as orjson.dumps() writes it. None when orjson could write the line\n"
"otherwise (see the module).");

/* usual_line()'s kinds of event. */
enum { LINE_SCORE, LINE_WIRE, LINE_GRAPHPIPE };

static PyObject *usual_line(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    const char *key = NULL, *request, *response, *logging, *request_id, *fqrv, *protocol;
    Py_ssize_t key_len = 0, request_len, response_len, logging_len, request_id_len, fqrv_len, protocol_len;
    const char *latency;
    Py_ssize_t latency_len, time_len, status_len, total;
    char time_text[32], status_text[32];
    long long event_time, status;
    long kind;
    int wire, graphpipe, served;
    PyObject *result;
    char *out;

    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "usual_line() takes exactly 12 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "usual_line(): kind must be an int (or a bool)");
        return NULL;
    }
    kind = PyLong_AsLong(args[0]);
    if (kind < LINE_SCORE || kind > LINE_GRAPHPIPE) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "usual_line(): kind must be 0 (score), 1 (V2 wire) or 2 (GraphPipe)");
        return NULL;
    }
    wire = kind == LINE_WIRE;
    graphpipe = kind == LINE_GRAPHPIPE;
    if (!PyBool_Check(args[4])) /* orjson writes other objects otherwise */
        Py_RETURN_NONE;
    served = args[4] == Py_True;
    if (!PyBytes_Check(args[5]) || !PyBytes_Check(args[8]) || !PyBytes_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError, "usual_line(): logging_json, fqrv_json and latency_ms must be bytes");
        return NULL;
    }
    latency = PyBytes_AS_STRING(args[9]);
    latency_len = PyBytes_GET_SIZE(args[9]);
    logging = PyBytes_AS_STRING(args[5]);
    logging_len = PyBytes_GET_SIZE(args[5]);
    fqrv = PyBytes_AS_STRING(args[8]);
    fqrv_len = PyBytes_GET_SIZE(args[8]);
    if ((args[1] != Py_None && (key = plain_text(args[1], &key_len)) == NULL) ||
        (request = body_of(args[2], &request_len)) == NULL || (response = body_of(args[3], &response_len)) == NULL ||
        (request_id = plain_text(args[7], &request_id_len)) == NULL || (protocol = plain_text(args[11], &protocol_len)) == NULL ||
        !PyLong_CheckExact(args[6]) || !PyLong_CheckExact(args[10]))
        Py_RETURN_NONE;
    event_time = as_long_long(args[6]);
    status = as_long_long(args[10]);
    if (PyErr_Occurred()) { /* beyond 64 bits: orjson's business */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    time_len = decimal(time_text, event_time);
    status_len = decimal(status_text, status);
    if (wire) {
        protocol = "v2";
        protocol_len = 2;
    }

    if (graphpipe) { /* the flatbuffers as base64 text, 4 characters for every 3 bytes */
        if (request_len > PY_SSIZE_T_MAX / 4 || response_len > PY_SSIZE_T_MAX / 4)
            return PyErr_NoMemory();
        request_len = base64_len(request_len);
        response_len = base64_len(response_len);
    }
    total = 250 + (key != NULL ? key_len + 2 : 4) + request_len + response_len + logging_len + time_len + request_id_len +
            fqrv_len + latency_len + status_len + protocol_len + (graphpipe ? fqrv_len : 0);
    if (total < 0) /* sizes past PY_SSIZE_T_MAX */
        return PyErr_NoMemory();
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL)
        return NULL;
    out = PyBytes_AS_STRING(result);
    out = graphpipe ? PUT_LITERAL(out, "{\"topic\":\"graphpipe\",\"key\":") : PUT_LITERAL(out, "{\"topic\":\"basic\",\"key\":");
    if (key != NULL) {
        *out++ = '"';
        out = put(out, key, key_len);
        *out++ = '"';
    } else {
        out = PUT_LITERAL(out, "null");
    }
    out = PUT_LITERAL(out, ",\"event\":{");
    if (graphpipe) {
        out = PUT_LITERAL(out, "\"prediction\":{\"inferResponse\":\"");
        out = put_base64(out, (const unsigned char *)response, PyBytes_GET_SIZE(args[3]));
        out = PUT_LITERAL(out, "\",\"fqrv\":");
        out = put(out, fqrv, fqrv_len);
        out = served ? PUT_LITERAL(out, "},\"servedRequest\":true") : PUT_LITERAL(out, "},\"servedRequest\":false");
        out = PUT_LITERAL(out, ",\"inferBytes\":\"");
        out = put_base64(out, (const unsigned char *)request, PyBytes_GET_SIZE(args[2]));
        out = PUT_LITERAL(out, "\",");
    } else if (!wire) {
        out = PUT_LITERAL(out, "\"prediction\":");
        out = put_body(out, response, response_len);
        out = served ? PUT_LITERAL(out, ",\"servedRequest\":true") : PUT_LITERAL(out, ",\"servedRequest\":false");
        out = PUT_LITERAL(out, ",\"inferenceRequest\":");
        out = put_body(out, request, request_len);
        *out++ = ',';
    } else {
        out = served ? PUT_LITERAL(out, "\"servedRequest\":true,") : PUT_LITERAL(out, "\"servedRequest\":false,");
    }
    out = PUT_LITERAL(out, "\"loggingSettings\":");
    out = put(out, logging, logging_len);
    out = PUT_LITERAL(out, ",\"eventTimeMS\":\"");
    out = put(out, time_text, time_len);
    out = PUT_LITERAL(out, "\",\"requestId\":\"");
    out = put(out, request_id, request_id_len);
    out = PUT_LITERAL(out, "\",\"fqrv\":");
    out = put(out, fqrv, fqrv_len);
    out = PUT_LITERAL(out, ",\"latencyMs\":");
    out = put(out, latency, latency_len);
    out = PUT_LITERAL(out, ",\"status\":");
    out = put(out, status_text, status_len);
    out = PUT_LITERAL(out, ",\"protocol\":\"");
    out = put(out, protocol, protocol_len);
    *out++ = '"';
    if (wire) {
        out = PUT_LITERAL(out, ",\"wireRequest\":");
        out = put_body(out, request, request_len);
        out = PUT_LITERAL(out, ",\"wireResponse\":");
        out = put_body(out, response, response_len);
    }
    out = PUT_LITERAL(out, "}}");
    if (_PyBytes_Resize(&result, out - PyBytes_AS_STRING(result)) < 0)
        return NULL;
    return result;
}

PyDoc_STRVAR(set_simd_doc,
"_set_simd(level) -> int\n\n"
"What base64 text is written with: 0 the plain loop, 1 SSSE3, 2 AVX2 (the default: the best the CPU has);\n"
"a level the CPU lacks is lowered to one it has. Returns the level before. For the tests of each path.");

static PyObject *set_simd(PyObject *Py_UNUSED(self), PyObject *level) {
    long want = PyLong_AsLong(level);
    int was;
    if (want == -1 && PyErr_Occurred())
        return NULL;
#ifdef BASE64_SIMD
    {
        int best = cpu_simd_level();
        was = simd_level;
        simd_level = want < 0 ? 0 : want > best ? best : (int)want;
    }
#else
    was = 0;
#endif
    return PyLong_FromLong(was);
}

static PyMethodDef methods[] = {
    {"usual_line", (PyCFunction)(void (*)(void))usual_line, METH_FASTCALL, usual_line_doc},
    {"_set_simd", set_simd, METH_O, set_simd_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonl", "The file log's JSON line of the usual event.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jsonl(void) {
    fill_base64_pairs();
#ifdef BASE64_SIMD
    simd_level = cpu_simd_level();
#endif
    return PyModule_Create(&module);
}
