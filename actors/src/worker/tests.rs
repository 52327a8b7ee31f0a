//! Device discovery from the environment.

use super::*;

#[test]
fn xinf_gpus_lists_indexes() {
    assert_eq!(visible_gpus(Some("0, 2"), None, None), Ok(vec![0, 2]));
    assert_eq!(visible_gpus(Some("none"), None, Some("0,1")), Ok(vec![]));
    assert_eq!(visible_gpus(Some("-1"), None, None), Ok(vec![]));
    assert!(matches!(visible_gpus(Some("0,x"), None, None), Err(ActorError::InvalidConfig { .. })));
    assert!(matches!(visible_gpus(Some("1,1"), None, None), Err(ActorError::InvalidConfig { .. })));
}

#[test]
fn cuda_visible_devices_are_renumbered() {
    assert_eq!(visible_gpus(None, None, Some("3,5")), Ok(vec![0, 1]));
    assert_eq!(visible_gpus(Some(""), None, Some("GPU-aaaa,GPU-bbbb,GPU-cccc")), Ok(vec![0, 1, 2]));
    assert_eq!(visible_gpus(None, None, Some("")), Ok(vec![]));
    assert_eq!(visible_gpus(None, None, Some("-1")), Ok(vec![]));
    assert_eq!(visible_gpus(None, None, None), Ok(vec![]));
}

#[test]
fn gpu_sharing_is_opt_in() {
    assert!(allow_gpu_sharing(Some("1")));
    assert!(allow_gpu_sharing(Some("True")));
    assert!(!allow_gpu_sharing(Some("0")));
    assert!(!allow_gpu_sharing(None));
}

#[test]
fn the_driver_count_comes_after_xinf_gpus_and_before_cuda_visible_devices() {
    // XINF_GPUS wins, even over a driver that sees more or none.
    assert_eq!(visible_gpus(Some("0"), Some(4), Some("0,1")), Ok(vec![0]));
    assert_eq!(visible_gpus(Some("none"), Some(2), None), Ok(vec![]));
    assert_eq!(visible_gpus(Some("3"), Some(0), None), Ok(vec![3]));
    // The driver's count, which already applies CUDA_VISIBLE_DEVICES, wins over its list.
    assert_eq!(visible_gpus(None, Some(2), Some("0,1,2,3")), Ok(vec![0, 1]));
    assert_eq!(visible_gpus(Some(""), Some(1), None), Ok(vec![0]));
    // A driver that sees no GPU means none.
    assert_eq!(visible_gpus(None, Some(0), Some("0,1")), Ok(vec![]));
    // No driver: CUDA_VISIBLE_DEVICES, else nothing.
    assert_eq!(visible_gpus(None, None, Some("5")), Ok(vec![0]));
    assert_eq!(visible_gpus(None, None, None), Ok(vec![]));
}

#[test]
fn gpus_carry_the_driver_description_where_it_has_one() {
    let h200 = GpuInfo { index: 0, name: Some("NVIDIA H200".into()), total_memory: Some(150_000_000_000) };
    let got = describe_gpus(&[0, 3], std::slice::from_ref(&h200));
    assert_eq!(got, vec![h200, GpuInfo::index_only(3)]);
    assert_eq!(describe_gpus(&[1], &[]), vec![GpuInfo::index_only(1)]);
}

#[test]
fn a_build_without_cuda_finds_gpus_in_the_environment_only() {
    // Without the feature no driver is asked; with it, a machine without a driver behaves the
    // same (the probe answers `None`, never a panic).
    if cfg!(not(feature = "cuda")) || !xinf_transfer_driver_present() {
        assert_eq!(detect_gpus(None, Some("0,1")).map(|g| g.len()), Ok(2));
    }
    assert_eq!(
        detect_gpus(Some("0"), None).map(|g| g.iter().map(|g| g.index).collect::<Vec<_>>()),
        Ok(vec![0])
    );
    assert_eq!(detect_gpus(Some("none"), Some("0,1")), Ok(vec![]));
}

#[cfg(feature = "cuda")]
fn xinf_transfer_driver_present() -> bool {
    xinf_transfer::gpu::driver_present()
}

#[cfg(not(feature = "cuda"))]
fn xinf_transfer_driver_present() -> bool {
    false
}
