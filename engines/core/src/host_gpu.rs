//! A GPU of this process as the host knows it. The driver numbers the GPUs a process sees from
//! 0, after `CUDA_VISIBLE_DEVICES` picked them: with `CUDA_VISIBLE_DEVICES=2,3` this process's
//! GPU 0 is the host's GPU 2. A child process started with `CUDA_VISIBLE_DEVICES=0` would run
//! on the host's GPU 0, another worker's perhaps, so an engine server is given the host's name
//! of its GPU; other processes of the host name it the same way.

use crate::EngineError;

/// The host's name of this process's GPU `gpu`: its entry in `CUDA_VISIBLE_DEVICES` (an index,
/// a `GPU-…` UUID or a MIG name), or `gpu` itself where the variable lists none.
pub fn host_gpu(gpu: usize) -> Result<String, EngineError> {
    host_gpu_in(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(), gpu)
}

/// [`host_gpu`] for the value `visible` of `CUDA_VISIBLE_DEVICES`.
fn host_gpu_in(visible: Option<&str>, gpu: usize) -> Result<String, EngineError> {
    let listed: Vec<&str> =
        visible.unwrap_or("").split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    // Unset, empty or hiding every GPU (`-1`): the index is the host's (a worker told of its
    // GPUs by `XINF_GPUS` alone).
    if listed.is_empty() || listed[0].starts_with('-') {
        return Ok(gpu.to_string());
    }
    match listed.get(gpu) {
        Some(name) => Ok((*name).to_owned()),
        None => Err(EngineError::invalid(
            "gpu_idx",
            format!(
                "GPU {gpu} is not among the {} GPUs this process sees (CUDA_VISIBLE_DEVICES={})",
                listed.len(),
                listed.join(",")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_is_named_by_its_entry_of_cuda_visible_devices() {
        assert_eq!(host_gpu_in(Some("2,3"), 0), Ok("2".to_owned()));
        assert_eq!(host_gpu_in(Some(" 2, 3 "), 1), Ok("3".to_owned()));
        assert_eq!(host_gpu_in(Some("GPU-8e1b,GPU-77aa"), 1), Ok("GPU-77aa".to_owned()));
        for unlisted in [None, Some(""), Some(" "), Some("-1")] {
            assert_eq!(host_gpu_in(unlisted, 5), Ok("5".to_owned()));
        }
    }

    #[test]
    fn a_gpu_past_the_list_is_refused_naming_it() {
        let err = host_gpu_in(Some("2,3"), 2).expect_err("refused").to_string();
        assert!(
            err.contains("gpu_idx") && err.contains("GPU 2") && err.contains("CUDA_VISIBLE_DEVICES=2,3"),
            "{err}"
        );
    }
}
