//! The one tokio runtime of the extension: page servers, fetches and lease sweeps run on it,
//! off the engine's threads.

use pyo3::PyResult;
use pyo3::exceptions::PyRuntimeError;
use std::sync::OnceLock;
use tokio::runtime::Runtime;

/// The process's runtime, started on first use.
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
    static RT: OnceLock<std::io::Result<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("xinf-kv")
            .enable_all()
            .build()
    })
    .as_ref()
    .map_err(|e| PyRuntimeError::new_err(format!("starting xinf_kv's runtime: {e}")))
}
