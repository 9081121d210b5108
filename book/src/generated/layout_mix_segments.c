void fb_4b479091456ef0f4(const int64_t *sizes, const int64_t *strides, const int64_t *offsets, void *const *ptrs) {
    if (!(sizes[2] == 0 && sizes[3] == sizes[4] && sizes[5] == sizes[6] && sizes[7] == sizes[1])) {
        fb_4b479091456ef0f4_c(sizes, strides, offsets, ptrs);
        return;
    }
    int64_t cut[8];
    for (int k = 0; k < 8; k++) cut[k] = sizes[k];
    int64_t moved[4];
    if (sizes[3] > sizes[2]) {
        cut[1] = sizes[3] - sizes[2];
        moved[0] = offsets[0] + sizes[2];
        moved[1] = offsets[1] + sizes[2];
        moved[2] = offsets[2] + sizes[2];
        moved[3] = offsets[3] + sizes[2];
        fb_4b479091456ef0f4_s0(cut, strides, moved, ptrs);
    }
    if (sizes[5] > sizes[4]) {
        cut[1] = sizes[5] - sizes[4];
        moved[0] = offsets[0] + sizes[4];
        moved[1] = offsets[1] + sizes[4];
        moved[2] = offsets[2] + sizes[4];
        moved[3] = offsets[3] + sizes[4];
        fb_4b479091456ef0f4_s1(cut, strides, moved, ptrs);
    }
    if (sizes[7] > sizes[6]) {
        cut[1] = sizes[7] - sizes[6];
        moved[0] = offsets[0] + sizes[6];
        moved[1] = offsets[1] + sizes[6];
        moved[2] = offsets[2] + sizes[6];
        moved[3] = offsets[3] + sizes[6];
        fb_4b479091456ef0f4_s2(cut, strides, moved, ptrs);
    }
}
