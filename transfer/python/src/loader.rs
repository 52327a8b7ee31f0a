//! The decode side: loads of a room's pages into the engine's own cache, in the background.
//!
//! A connector starts a load when its engine has reserved blocks for an incoming request; the
//! load fetches the room's pages from the prefill side's page server (GPU to GPU by CUDA IPC when
//! both are on this host and the cache is on a GPU, else the pages over TCP) and scatters them
//! into those blocks with xinf's kernel, writing only the tokens asked for. The engine keeps
//! computing meanwhile; the connector polls for finished loads and reports each, failed or not,
//! exactly once, as the engine requires.

use crate::layout::Layout;
use crate::load::{Counters, Load};
use crate::runtime::runtime;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use xinf_transfer::PAGE_TOKENS;
use xinf_transfer::device::KvDevice;
use xinf_transfer::sync::lock;
use xinf_transfer::transport::{self, Endpoint, TransportPolicy};

/// One finished load: its request, and why it failed if it did.
struct Done {
    request: String,
    error: Option<String>,
}

#[derive(Default)]
struct Finished {
    done: Mutex<Vec<Done>>,
    changed: Condvar,
}

/// Loads of rooms' pages into the engine's cache on GPU `device` (or in host memory).
#[pyclass(module = "xinf_kv._native")]
pub(crate) struct PageLoader {
    device: Option<usize>,
    finished: Arc<Finished>,
    counters: Arc<Counters>,
}

#[pymethods]
impl PageLoader {
    /// Loads into engine memory on GPU `device` of this process (`None`: host memory).
    #[new]
    #[pyo3(signature = (device = None))]
    fn new(device: Option<usize>) -> PyResult<Self> {
        #[cfg(feature = "cuda")]
        if let Some(d) = device {
            crate::gpu::gpu(d)?;
        }
        #[cfg(not(feature = "cuda"))]
        if let Some(d) = device {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "GPU {d}: this build of xinf_kv has no GPU support"
            )));
        }
        runtime()?;
        Ok(Self { device, finished: Arc::default(), counters: Arc::default() })
    }

    /// Starts loading the KV of tokens `tokens` (a `(start, end)` pair) of `room`, published at
    /// `endpoint` (xinf's `Endpoint` as JSON; `source` its `KvDevice`, if the pages are on a
    /// GPU), into the engine memory `regions` through `block_table`. Bad arguments raise here;
    /// a load that fails later is reported by [`poll`](Self::poll) like one that succeeds.
    #[pyo3(signature = (request_id, endpoint, room, source, layout, regions, block_table, tokens, timeout_ms = 30_000))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        request_id: String,
        endpoint: &str,
        room: u64,
        source: Option<&str>,
        layout: &Layout,
        regions: Vec<u64>,
        block_table: Vec<u32>,
        tokens: (usize, usize),
        timeout_ms: u64,
    ) -> PyResult<()> {
        let endpoint: Endpoint =
            serde_json::from_str(endpoint).map_err(|e| PyValueError::new_err(format!("endpoint: {e}")))?;
        let source: Option<KvDevice> = source
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("source: {e}")))?;
        let tokens = tokens.0..tokens.1;
        let pages = tokens.start / PAGE_TOKENS..tokens.end.div_ceil(PAGE_TOKENS);
        layout.check(&regions, &block_table, &tokens, &pages)?;
        let load = Load {
            endpoint,
            room,
            source,
            layout: layout.clone(),
            regions,
            block_table,
            tokens,
            timeout: Duration::from_millis(timeout_ms.max(1)),
        };
        let (finished, counters, device) = (self.finished.clone(), self.counters.clone(), self.device);
        counters.started.fetch_add(1, Ordering::Relaxed);
        runtime()?.spawn(async move {
            let result = run(load, device, &counters).await;
            let error = match result {
                Ok(()) => {
                    counters.loaded.fetch_add(1, Ordering::Relaxed);
                    None
                }
                Err(e) => {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(request_id = %request_id, error = %e, "loading KV pages failed");
                    Some(e)
                }
            };
            lock(&finished.done).push(Done { request: request_id, error });
            finished.changed.notify_all();
        });
        Ok(())
    }

    /// The loads finished since the last poll: `(request_id, error or None)` each, once.
    fn poll(&self) -> Vec<(String, Option<String>)> {
        std::mem::take(&mut *lock(&self.finished.done)).into_iter().map(|d| (d.request, d.error)).collect()
    }

    /// Waits up to `timeout_s` for at least one load to finish (without holding the GIL), then
    /// polls.
    fn wait(&self, py: Python<'_>, timeout_s: f64) -> Vec<(String, Option<String>)> {
        let finished = self.finished.clone();
        py.detach(move || {
            let done = lock(&finished.done);
            let timeout = Duration::from_secs_f64(timeout_s.max(0.0));
            let _ = finished.changed.wait_timeout_while(done, timeout, |d| d.is_empty());
        });
        self.poll()
    }

    /// Loads started, loaded, failed, and the bytes that arrived GPU to GPU and through host
    /// memory.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.counters;
        let d = PyDict::new(py);
        for (k, v) in [
            ("started", &c.started),
            ("loaded", &c.loaded),
            ("failed", &c.failed),
            ("device_bytes_in", &c.device_bytes_in),
            ("host_bytes_in", &c.host_bytes_in),
        ] {
            d.set_item(k, v.load(Ordering::Relaxed))?;
        }
        Ok(d)
    }
}

/// Runs one load: fetch, then scatter.
async fn run(load: Load, device: Option<usize>, counters: &Counters) -> Result<(), String> {
    if load.tokens.is_empty() {
        return Ok(());
    }
    let first = (load.tokens.start / PAGE_TOKENS) as u32;
    let count = (load.tokens.end.div_ceil(PAGE_TOKENS) as u32).saturating_sub(first);
    #[cfg(feature = "cuda")]
    if let Some(ordinal) = device {
        let same_host = load.source.as_ref().is_some_and(|s| s.host == xinf_transfer::device::host_id());
        return crate::gpu::load(load, ordinal, first, count, same_host, counters).await;
    }
    let _ = device;
    let (bytes, _) =
        transport::fetch(&load.endpoint, load.room, first, count, TransportPolicy::Auto, load.timeout)
            .await
            .map_err(|e| e.to_string())?;
    counters.host_bytes_in.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || {
        crate::layout::scatter_bytes(
            &load.layout,
            &load.regions,
            &load.block_table,
            load.tokens,
            first as usize,
            &bytes,
        )
    })
    .await
    .map_err(|e| format!("scattering pages stopped: {e}"))?
}
