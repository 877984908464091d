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
