// Host helper of a program placed along a Hilbert curve (ir/worklist.py's `hilbert_order`, the same arithmetic):
// inlined after host.cuh only where the launch's rule is "hilbert".
inline int spatialc_sign(int v) { return (v > 0) - (v < 0); }
inline int spatialc_abs(int v) { return v < 0 ? -v : v; }
inline int spatialc_floor_half(int v) { return v >= 0 ? v / 2 : -((1 - v) / 2); }  // Python's v // 2

// The cells of the rectangle at (x, y) spanned by (ax, ay), its major side, and (bx, by), appended to `out` as
// items of a grid `nx` wide: the curve enters at (x, y) and leaves at the far end of the major side.
inline void spatialc_gilbert(std::vector<int>& out, int nx, int x, int y, int ax, int ay, int bx, int by)
{
    const int w = spatialc_abs(ax + ay), h = spatialc_abs(bx + by);
    const int dax = spatialc_sign(ax), day = spatialc_sign(ay), dbx = spatialc_sign(bx), dby = spatialc_sign(by);
    if (h == 1 || w == 1) {
        const int sx = h == 1 ? dax : dbx, sy = h == 1 ? day : dby, n = h == 1 ? w : h;
        for (int i = 0; i < n; ++i) {
            out.push_back((y + i * sy) * nx + x + i * sx);
        }
        return;
    }
    int ax2 = spatialc_floor_half(ax), ay2 = spatialc_floor_half(ay);
    int bx2 = spatialc_floor_half(bx), by2 = spatialc_floor_half(by);
    if (2 * w > 3 * h) {
        if (spatialc_abs(ax2 + ay2) % 2 && w > 2) {
            ax2 += dax;
            ay2 += day;
        }
        spatialc_gilbert(out, nx, x, y, ax2, ay2, bx, by);
        spatialc_gilbert(out, nx, x + ax2, y + ay2, ax - ax2, ay - ay2, bx, by);
        return;
    }
    if (spatialc_abs(bx2 + by2) % 2 && h > 2) {
        bx2 += dbx;
        by2 += dby;
    }
    spatialc_gilbert(out, nx, x, y, bx2, by2, ax2, ay2);
    spatialc_gilbert(out, nx, x + bx2, y + by2, ax, ay, bx - bx2, by - by2);
    spatialc_gilbert(out, nx, x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby), -bx2, -by2, -(ax - ax2),
                     -(ay - ay2));
}

// The work list of the hilbert rule: the items of the ny × nx grid along the curve (its major side the longer one,
// unless that is odd and the other even), dealt round-robin over `sites`, laid out as spatialc_work_list lays it.
inline std::vector<int> spatialc_hilbert_work_list(int items, int sites, int ny, int nx)
{
    std::vector<int> order;
    order.reserve((size_t)items);
    bool major_y = ny > nx;
    if ((major_y ? ny : nx) % 2 == 1 && (major_y ? nx : ny) % 2 == 0) {
        major_y = !major_y;
    }
    if ((long long)ny * nx != items || ny < 1) {  // (not printed so) the plain order
        for (int i = 0; i < items; ++i) {
            order.push_back(i);
        }
    } else if (major_y) {
        spatialc_gilbert(order, nx, 0, 0, 0, ny, nx, 0);
    } else {
        spatialc_gilbert(order, nx, 0, 0, nx, 0, 0, ny);
    }
    std::vector<int> w(2 * (size_t)sites + (size_t)items);
    int at = 0;
    for (int s = 0; s < sites; ++s) {
        w[(size_t)s] = at;
        for (int i = s; i < items; i += sites) {
            w[2 * (size_t)sites + (size_t)at++] = order[(size_t)i];
        }
        w[(size_t)sites + (size_t)s] = at - w[(size_t)s];
    }
    return w;
}
