use xinf_transfer::gpu::nvrtc_arch;

#[test]
fn the_kernels_are_compiled_for_the_gpus_own_architecture() {
    assert_eq!(nvrtc_arch(9, 0), "compute_90a");
}
