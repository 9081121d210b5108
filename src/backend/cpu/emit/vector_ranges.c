#if defined(FB_AVX512)
/* The lanes l of the vector at index j whose index j + l is below `end`, and those within
   [start, end): where a concat read along a row kernel's rows takes an operand. */
static inline __mmask16 fbv_lanes_below(int64_t j, int64_t end) {
    int64_t d = end - j;
    return d <= 0 ? (__mmask16)0 : d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << d) - 1u);
}
static inline __mmask16 fbv_range_lanes(int64_t j, int64_t start, int64_t end) {
    return (__mmask16)(fbv_lanes_below(j, end) & (__mmask16)~fbv_lanes_below(j, start));
}
#endif
