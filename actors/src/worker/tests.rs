//! Device discovery from the environment.

use super::*;

#[test]
fn xinf_gpus_lists_indexes() {
    assert_eq!(visible_gpus(Some("0, 2"), None), Ok(vec![0, 2]));
    assert_eq!(visible_gpus(Some("none"), Some("0,1")), Ok(vec![]));
    assert_eq!(visible_gpus(Some("-1"), None), Ok(vec![]));
    assert!(matches!(visible_gpus(Some("0,x"), None), Err(ActorError::InvalidConfig { .. })));
    assert!(matches!(visible_gpus(Some("1,1"), None), Err(ActorError::InvalidConfig { .. })));
}

#[test]
fn cuda_visible_devices_are_renumbered() {
    assert_eq!(visible_gpus(None, Some("3,5")), Ok(vec![0, 1]));
    assert_eq!(visible_gpus(Some(""), Some("GPU-aaaa,GPU-bbbb,GPU-cccc")), Ok(vec![0, 1, 2]));
    assert_eq!(visible_gpus(None, Some("")), Ok(vec![]));
    assert_eq!(visible_gpus(None, Some("-1")), Ok(vec![]));
    assert_eq!(visible_gpus(None, None), Ok(vec![]));
}

#[test]
fn gpu_sharing_is_opt_in() {
    assert!(allow_gpu_sharing(Some("1")));
    assert!(allow_gpu_sharing(Some("True")));
    assert!(!allow_gpu_sharing(Some("0")));
    assert!(!allow_gpu_sharing(None));
}
