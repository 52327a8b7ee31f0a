//! A captured decode step as the driver holds it, and the programmatic dependent launch edges
//! put between its kernels.
//!
//! A decode step of a small model is a few hundred short kernels, and replaying them from a
//! graph still leaves a gap between each kernel's end and the next one's start: the next is
//! launched only once the previous has finished and its writes are flushed. On Hopper and
//! later, an edge of type *programmatic* with the *launch order* port lets the next kernel's
//! blocks be placed as soon as every block of the previous one has started; each of our kernels
//! begins with `griddepcontrol.wait` (`GRID_DEP_WAIT` in `kernels.cu`), which holds it until the
//! previous kernel has finished and its writes are visible, so what it computes is unchanged and
//! only the launch gap goes. Only edges between two of our own kernels are changed: a cuBLAS
//! kernel does not wait that way, so an edge into one stays as captured.
//!
//! The edges are rewritten on a clone of the captured graph; if the driver refuses anything,
//! the clone is dropped and the graph is used as captured.

// Raw driver calls on graphs cudarc does not wrap; each unsafe block says why it is sound.
#![allow(unsafe_code)]

use super::super::error::{GpuError, driver};
use cudarc::driver::result;
use cudarc::driver::sys::{
    self, CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER, CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC,
    CUDA_KERNEL_NODE_PARAMS, CUgraph, CUgraphDependencyType, CUgraphEdgeData, CUgraphExec,
    CUgraphInstantiate_flags, CUgraphNode, CUgraphNodeType,
};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use std::ptr::null_mut;
use std::sync::Arc;

/// A captured graph and its executable instance, destroyed together.
pub(super) struct Captured {
    graph: CUgraph,
    exec: CUgraphExec,
    stream: Arc<CudaStream>,
}

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are serialized (it
// is not internally synchronized). This one is owned by `Graphs`, inside `GpuModel`, which is
// used through `&mut self` by the one engine thread at a time that owns it, so every call is
// serialized.
unsafe impl Send for Captured {}

impl Captured {
    /// Ends the capture begun on `stream` and instantiates what it recorded, with programmatic
    /// edges between the kernels of `ours` (addresses of their `CUfunction`s) when `linked`.
    /// Returns the graph and how many edges became programmatic.
    pub(super) fn end(
        stream: &Arc<CudaStream>,
        ours: &[usize],
        linked: bool,
    ) -> Result<(Self, usize), GpuError> {
        stream.context().bind_to_thread().map_err(driver)?;
        // SAFETY: the stream is valid (owned by the `Arc`) and in capture mode.
        let graph = unsafe { result::stream::end_capture(stream.cu_stream()) }.map_err(driver)?;
        if graph.is_null() {
            return Err(GpuError::Driver("an empty graph".into()));
        }
        let mut captured = Self { graph, exec: null_mut(), stream: stream.clone() };
        let mut edges = 0;
        if linked {
            // The launch order port places the next kernel as soon as this one's blocks have all
            // started; a driver that refuses it may still take the programmatic port, which
            // fires once every block has passed `griddepcontrol.launch_dependents`.
            // SAFETY: `captured.graph` is a valid graph this function owns.
            let clone =
                unsafe { linked_clone(captured.graph, ours, CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER as u8) }
                    .or_else(|e| {
                        tracing::debug!("launch order edges refused ({e}); trying programmatic ones");
                        // SAFETY: as above.
                        unsafe {
                            linked_clone(captured.graph, ours, CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8)
                        }
                    });
            match clone {
                Ok((clone, n)) => {
                    // SAFETY: the graph is ours and no instance of it exists yet.
                    let _ = unsafe { result::graph::destroy(captured.graph) };
                    captured.graph = clone;
                    edges = n;
                }
                Err(e) => tracing::debug!("decode graph kept without programmatic launches: {e}"),
            }
        }
        // SAFETY: the graph is valid; the instance is destroyed with it in `drop`.
        captured.exec = unsafe { result::graph::instantiate(captured.graph, CUgraphInstantiate_flags(0)) }
            .map_err(driver)?;
        // SAFETY: instance and stream are valid.
        unsafe { result::graph::upload(captured.exec, stream.cu_stream()) }.map_err(driver)?;
        Ok((captured, edges))
    }

    /// Launches the graph on the stream it was captured on.
    pub(super) fn launch(&self) -> Result<(), GpuError> {
        self.stream.context().bind_to_thread().map_err(driver)?;
        // SAFETY: instance and stream are valid for as long as `self` lives.
        unsafe { result::graph::launch(self.exec, self.stream.cu_stream()) }.map_err(driver)
    }
}

impl Drop for Captured {
    fn drop(&mut self) {
        if self.stream.context().bind_to_thread().is_err() {
            return;
        }
        // SAFETY: both handles are ours and destroyed once; a failure leaves nothing to do.
        unsafe {
            if !self.exec.is_null() {
                let _ = result::graph::exec_destroy(self.exec);
            }
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// Whether programmatic edges can be had: a GPU of compute capability 9.0 or later
/// (`griddepcontrol`) and a driver of CUDA 12.3 or later (edges with data; an older driver
/// lacks the calls).
pub(super) fn available(ctx: &CudaContext) -> bool {
    let Ok((major, _)) = ctx.compute_capability() else { return false };
    let mut version = 0;
    // SAFETY: the driver writes one integer.
    let driver_ok = unsafe { sys::cuDriverGetVersion(&mut version) }.result().is_ok();
    major >= 9 && driver_ok && version >= 12_030
}

/// A clone of `graph` whose edges between two kernels of `ours` are programmatic, leaving from
/// `port`, and how many there are; the clone is destroyed if any call fails.
///
/// # Safety
/// `graph` must be a valid graph.
unsafe fn linked_clone(graph: CUgraph, ours: &[usize], port: u8) -> Result<(CUgraph, usize), DriverError> {
    let mut clone = null_mut();
    // SAFETY: `graph` is valid (caller); `clone` receives a new graph we own.
    unsafe { sys::cuGraphClone(&mut clone, graph) }.result()?;
    // SAFETY: `clone` is valid and ours.
    match unsafe { link(clone, ours, port) } {
        Ok(n) => Ok((clone, n)),
        Err(e) => {
            // SAFETY: as above; destroyed once.
            let _ = unsafe { result::graph::destroy(clone) };
            Err(e)
        }
    }
}

/// Makes every edge between two kernels of `ours` in `graph` programmatic, leaving from `port`.
///
/// # Safety
/// `graph` must be a valid graph that is not in use.
unsafe fn link(graph: CUgraph, ours: &[usize], port: u8) -> Result<usize, DriverError> {
    let mut n = 0usize;
    // SAFETY: null arrays ask for the edge count only.
    unsafe { sys::cuGraphGetEdges_v2(graph, null_mut(), null_mut(), null_mut(), &mut n) }.result()?;
    let (mut from, mut to) = (vec![null_mut(); n], vec![null_mut(); n]);
    let mut data = vec![edge(0, CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT); n];
    // SAFETY: three arrays of `n` entries, `n` passed in and updated.
    unsafe { sys::cuGraphGetEdges_v2(graph, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut n) }
        .result()?;
    let programmatic = edge(port, CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
    let mut linked = 0;
    for i in 0..n.min(from.len()) {
        let plain = data[i].type_ == CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8;
        // SAFETY: the nodes come from this graph's own edge list.
        if !plain || !unsafe { is_ours(from[i], ours) && is_ours(to[i], ours) } {
            continue;
        }
        // SAFETY: the edge exists as described by `data[i]`; the new one joins the same nodes.
        unsafe {
            sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &data[i], 1).result()?;
            sys::cuGraphAddDependencies_v2(graph, &from[i], &to[i], &programmatic, 1).result()?;
        }
        linked += 1;
    }
    Ok(linked)
}

fn edge(from_port: u8, kind: CUgraphDependencyType) -> CUgraphEdgeData {
    CUgraphEdgeData { from_port, to_port: 0, type_: kind as u8, reserved: [0; 5] }
}

/// Whether `node` launches one of `ours`.
///
/// # Safety
/// `node` must be a node of a valid graph.
unsafe fn is_ours(node: CUgraphNode, ours: &[usize]) -> bool {
    let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: `node` is valid (caller).
    if unsafe { sys::cuGraphNodeGetType(node, &mut kind) }.result().is_err()
        || kind != CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL
    {
        return false;
    }
    // SAFETY: plain old data the driver fills in.
    let mut params: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: a kernel node (checked above) and a parameter struct to fill.
    unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut params) }.result().is_ok()
        && ours.contains(&(params.func as usize))
}
