//! The one tokio runtime of the extension: page servers, fetches and lease sweeps run on it,
//! off the engine's threads.

use pyo3::PyResult;
use pyo3::exceptions::PyRuntimeError;
use std::sync::OnceLock;
use tokio::runtime::Runtime;

/// The process's runtime, started on first use. It also takes the page plane's key from
/// `XINF_KV_KEY` (64 hex digits; xinf gives it to the engine servers it starts), so the page
/// servers and fetches of this process talk to xinf's and to no one else's.
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
    static RT: OnceLock<std::io::Result<Runtime>> = OnceLock::new();
    static KEY: OnceLock<Result<(), String>> = OnceLock::new();
    KEY.get_or_init(|| match std::env::var("XINF_KV_KEY") {
        Ok(hex) => xinf_transfer::transport::PageKey::from_hex(&hex)
            .map(|key| {
                xinf_transfer::transport::set_process_key(key);
            })
            .map_err(|e| format!("XINF_KV_KEY: {e}")),
        Err(_) => Ok(()),
    })
    .clone()
    .map_err(PyRuntimeError::new_err)?;
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
