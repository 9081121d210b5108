for (; j < jv; j += 16) {
    if (j >= rs0 && j + 16 <= re0) {
        const __m512 v0 = _mm512_loadu_ps(&p0[b0 + j]);
        const __m512 v1 = _mm512_maskz_loadu_ps(fbv_range_lanes(j, rs1, re1), &p1[b1 + j]);
        const __m512 v2 = _mm512_maskz_loadu_ps(fbv_range_lanes(j, rs1, re1), &p2[b2 + j]);
        const __m512 v3 = _mm512_add_ps(v1, v2);
        const __m512 v4 = v0;
        vm5 = _mm512_max_ps(v4, vm5);
        vn5 |= _mm512_cmp_ps_mask(v4, v4, _CMP_UNORD_Q);
    }
    else if (j >= rs1 && j + 16 <= re1 && j >= re0) {
        const __m512 v0 = _mm512_maskz_loadu_ps(fbv_range_lanes(j, rs0, re0), &p0[b0 + j]);
        const __m512 v1 = _mm512_loadu_ps(&p1[b1 + j]);
        const __m512 v2 = _mm512_loadu_ps(&p2[b2 + j]);
        const __m512 v3 = _mm512_add_ps(v1, v2);
        const __m512 v4 = v3;
        vm5 = _mm512_max_ps(v4, vm5);
        vn5 |= _mm512_cmp_ps_mask(v4, v4, _CMP_UNORD_Q);
    }
    else {
        const __m512 v0 = _mm512_maskz_loadu_ps(fbv_range_lanes(j, rs0, re0), &p0[b0 + j]);
        const __m512 v1 = _mm512_maskz_loadu_ps(fbv_range_lanes(j, rs1, re1), &p1[b1 + j]);
        const __m512 v2 = _mm512_maskz_loadu_ps(fbv_range_lanes(j, rs1, re1), &p2[b2 + j]);
        const __m512 v3 = _mm512_add_ps(v1, v2);
        const __m512 v4 = _mm512_mask_blend_ps(fbv_lanes_below(j, re0), v3, v0);
        vm5 = _mm512_max_ps(v4, vm5);
        vn5 |= _mm512_cmp_ps_mask(v4, v4, _CMP_UNORD_Q);
    }
}
