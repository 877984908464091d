// Host helper of a program whose kernel takes operands stored as matrices (the sm_90a form): inlined after the
// tiled helpers only where a parameter's order is "rows" or "cols".
// Not tiled: the matrix zero-padded to rows of `pitch` elements — or, `transposed`, its transpose (each column one
// padded row): the operands the sm_90a form's copy engine loads.
template <typename T>
inline void spatialc_store_matrix(const std::vector<double>& x, int rows, int cols, int pitch, std::vector<T>& t,
                                  bool transposed)
{
    for (int i = 0; i < rows; ++i) {
        for (int j = 0; j < cols; ++j) {
            t[transposed ? (size_t)j * pitch + i : (size_t)i * pitch + j] = (T)x[(size_t)i * cols + j];
        }
    }
}

// A grouped tensor's matrices (attention's Q, K, V: a head after another), each group's `rows` zero-padded to its
// `rows_t` tile rows, group after group, as `spatialc_tilize_groups` lays tiles: rows of `pitch` elements.
template <typename T>
inline void spatialc_store_matrix_groups(const std::vector<double>& x, int groups, int rows, int cols, int rows_t,
                                         int pitch, std::vector<T>& t)
{
    for (int g = 0; g < groups; ++g) {
        for (int i = 0; i < rows; ++i) {
            for (int j = 0; j < cols; ++j) {
                const size_t at = ((size_t)g * rows_t * 16 + i) * pitch + j;
                t[at] = (T)x[((size_t)g * rows + i) * cols + j];
            }
        }
    }
}
