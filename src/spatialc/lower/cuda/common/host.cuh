// Host helpers of a spatialc program: read a matrix, store it tiled (16 x 16 tiles, zero padding), read it back.
inline int spatialc_read(const char* path, std::vector<double>& v)
{
    FILE* f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 0;
    }
    for (size_t i = 0; i < v.size(); ++i) {
        if (fscanf(f, "%lf", &v[i]) != 1) {
            fprintf(stderr, "%s: expected %zu numbers, found %zu\n", path, v.size(), i);
            fclose(f);
            return 0;
        }
    }
    fclose(f);
    return 1;
}

inline size_t spatialc_tiled_index(int i, int j, int cols_t, bool col = false)
{
    const size_t inside = col ? (size_t)(j % 16) * 16 + (size_t)(i % 16) : (size_t)(i % 16) * 16 + (size_t)(j % 16);
    return ((size_t)(i / 16) * (size_t)cols_t + (size_t)(j / 16)) * 256 + inside;
}

// An element of a value: a cast (w4_host.cuh's spatialc_e8m0_of: an e8m0 scale's code).
template <typename T>
struct spatialc_cast {
    T operator()(double v) const { return (T)v; }
};

// An e5m2 element: its value — the inputs were rounded to e5m2 already (inputs.check_inputs), so what is left to
// keep is ±inf, which e5m2 holds and cuda_fp8.h's constructor saturates to ±57344 (cvt.rn.satfinite).
template <typename T>
struct spatialc_e5m2_of {
    T operator()(double v) const
    {
        T t(v);
        if (__builtin_isinf(v)) t.__x = (unsigned char)(v > 0 ? 0x7c : 0xfc);  // e5m2's +inf and -inf
        return t;
    }
};

// `col`: each tile column-major (the K-major B operand of an int8 kernel); `value`: an element of each value.
template <typename T, typename F = spatialc_cast<T>>
inline void spatialc_tilize(const std::vector<double>& x, int rows, int cols, int cols_t, std::vector<T>& t,
                            bool col = false, F value = F())
{
    for (int i = 0; i < rows; ++i) {
        for (int j = 0; j < cols; ++j) {
            t[spatialc_tiled_index(i, j, cols_t, col)] = (T)value(x[(size_t)i * cols + j]);
        }
    }
}

// A grouped tensor: `groups` matrices of rows × cols one after another in x, each tiled on its own grid of rows_t ×
// cols_t tiles, the grids one after another in t.
template <typename T, typename F = spatialc_cast<T>>
inline void spatialc_tilize_groups(const std::vector<double>& x, int groups, int rows, int cols, int rows_t,
                                   int cols_t, std::vector<T>& t, bool col = false, F value = F())
{
    for (int g = 0; g < groups; ++g) {
        const size_t base = (size_t)g * (size_t)rows_t * (size_t)cols_t * 256;
        for (int i = 0; i < rows; ++i) {
            for (int j = 0; j < cols; ++j) {
                t[base + spatialc_tiled_index(i, j, cols_t, col)] = (T)value(x[((size_t)g * rows + i) * cols + j]);
            }
        }
    }
}

// The first value of `v` (a grouped GEMM's row counts) that is no whole number in 0..limit, or -1.
inline long long spatialc_count_out(const std::vector<double>& v, int limit)
{
    for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] < 0 || v[i] > limit || v[i] != (double)(long long)v[i]) {
            return (long long)i;
        }
    }
    return -1;
}

// Deterministic, non-zero, small inputs for timing: exact in every operand type.
inline void spatialc_bench_input(std::vector<double>& v, int salt)
{
    for (size_t i = 0; i < v.size(); ++i) {
        v[i] = (double)((int)((i * 5 + (size_t)salt) % 9) + 1) * ((i % 2) ? -1.0 : 1.0);
    }
}

// The sites a launch runs: as many as the device keeps resident (its multiprocessors × per_sm blocks each) and no
// more than there are items; a kernel whose placement does not follow the device (per_sm 0) keeps its planned grid.
inline int spatialc_sites(int items, int sms, int per_sm, int planned)
{
    if (per_sm <= 0 || sms <= 0) {
        return planned;
    }
    const long long resident = (long long)sms * per_sm;
    return resident < items ? (int)resident : items;
}

// The work list of ir/worklist.py's placement rules: each site's offset into the item list, then each site's
// count, then the items — contiguous runs (the first items % sites sites one longer), item i on site i % sites
// (rule 1), or (rule 2) the items of the ny × nx grid in bands of `band` rows, each band column by column, dealt
// out the same way.
inline std::vector<int> spatialc_work_list(int items, int sites, int rule, int ny = 0, int nx = 0, int band = 0)
{
    std::vector<int> order((size_t)items);
    for (int i = 0; i < items; ++i) {
        order[(size_t)i] = i;
    }
    if (rule == 2 && band > 0 && (long long)ny * nx == items) {  // else (not printed so) the plain order
        size_t v = 0;
        for (int top = 0; top < ny; top += band) {
            const int rows = ny - top < band ? ny - top : band;
            for (int x = 0; x < nx; ++x) {
                for (int r = 0; r < rows; ++r) {
                    order[v++] = (top + r) * nx + x;
                }
            }
        }
    }
    std::vector<int> w(2 * (size_t)sites + (size_t)items);
    int* off = w.data();
    int* count = off + sites;
    int* list = count + sites;
    int at = 0;
    const int q = items / sites, r = items % sites;
    for (int s = 0; s < sites; ++s) {
        off[s] = at;
        if (rule != 0) {
            for (int i = s; i < items; i += sites) {
                list[at++] = order[(size_t)i];
            }
        } else {
            const int start = s * q + (s < r ? s : r);
            for (int i = 0; i < q + (s < r ? 1 : 0); ++i) {
                list[at++] = start + i;
            }
        }
        count[s] = at - off[s];
    }
    return w;
}
