//! An engine's KV layout as Python sees it, and the CPU copies between engine memory and
//! canonical pages.

// The engine's memory is named by address (`tensor.data_ptr()`): turning it into slices is
// `unsafe`, and each such place below says what makes it sound.
#![allow(unsafe_code)]

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::ops::Range;
use xinf_transfer::{Direction, KvLayout, LayoutDescriptor, PAGE_TOKENS, PageShape, copy_token_pages};

/// An engine's KV cache layout: xinf's layout descriptor (planes and strides) plus the size of
/// one element.
#[pyclass(frozen, module = "xinf_kv._native")]
#[derive(Clone)]
pub(crate) struct Layout {
    pub(crate) desc: LayoutDescriptor,
    pub(crate) elem_bytes: usize,
}

#[pymethods]
impl Layout {
    /// `kind` is an xinf `kv_layout` name (`paged-packed` for vLLM 0.26, `token-pool` for
    /// SGLang), `order` `NHD` or `HND`, `num_blocks` the blocks (pool: slots) of the cache.
    #[new]
    #[pyo3(signature = (kind, block_size, layers, kv_heads, head_dim, num_blocks, elem_bytes, order = "NHD"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        kind: &str,
        block_size: usize,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        num_blocks: usize,
        elem_bytes: usize,
        order: &str,
    ) -> PyResult<Self> {
        let bad = |e: xinf_transfer::LayoutError| PyValueError::new_err(e.to_string());
        let layout =
            KvLayout { kind: kind.parse().map_err(bad)?, order: order.parse().map_err(bad)?, block_size };
        if ![2, 4].contains(&elem_bytes) {
            return Err(PyValueError::new_err(format!("elem_bytes {elem_bytes} (2 or 4 expected)")));
        }
        let desc = layout.describe(layers, kv_heads, head_dim, num_blocks).map_err(bad)?;
        Ok(Self { desc, elem_bytes })
    }

    /// Memory regions (tensors) the cache is made of, in the order addresses are given.
    #[getter]
    fn num_regions(&self) -> usize {
        self.desc.num_regions
    }

    /// Bytes of each region.
    #[getter]
    fn region_bytes(&self) -> usize {
        self.desc.region_len * self.elem_bytes
    }

    /// Bytes of one canonical page.
    #[getter]
    fn page_bytes(&self) -> usize {
        self.page_bytes_usize()
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.desc.block_size()
    }

    fn __repr__(&self) -> String {
        let d = &self.desc;
        format!(
            "Layout({}, layers={}, kv_heads={}, head_dim={}, num_blocks={}, elem_bytes={})",
            d.layout, d.num_layers, d.kv_heads, d.head_dim, d.num_blocks, self.elem_bytes
        )
    }
}

impl Layout {
    /// Bytes of one canonical page.
    pub(crate) fn page_bytes_usize(&self) -> usize {
        self.shape().page_elems() * self.elem_bytes
    }

    pub(crate) fn shape(&self) -> PageShape {
        PageShape { layers: self.desc.num_layers, kv_heads: self.desc.kv_heads, head_dim: self.desc.head_dim }
    }

    /// Checks a copy's arguments against the layout, so that no copy can index out of the
    /// engine's memory or panic: the region count, the pages asked for, and a block table that
    /// covers the tokens with blocks of the cache.
    pub(crate) fn check(
        &self,
        regions: &[u64],
        block_table: &[u32],
        tokens: &Range<usize>,
        pages: &Range<usize>,
    ) -> PyResult<()> {
        let d = &self.desc;
        if regions.len() != d.num_regions {
            return Err(PyValueError::new_err(format!(
                "{} region addresses for a layout of {} regions",
                regions.len(),
                d.num_regions
            )));
        }
        if regions.contains(&0) {
            return Err(PyValueError::new_err("a region address of 0"));
        }
        if tokens.start > tokens.end {
            return Err(PyValueError::new_err(format!("tokens {tokens:?}")));
        }
        let end = tokens.end.min(pages.end * PAGE_TOKENS);
        let needed = end.div_ceil(d.block_size());
        if block_table.len() < needed {
            return Err(PyValueError::new_err(format!(
                "a block table of {} blocks for {end} tokens of {}-token blocks",
                block_table.len(),
                d.block_size()
            )));
        }
        if let Some(b) = block_table[..needed].iter().find(|&&b| b as usize >= d.num_blocks) {
            return Err(PyValueError::new_err(format!("block {b} of a cache of {} blocks", d.num_blocks)));
        }
        Ok(())
    }
}

/// Canonical pages `first_page .. first_page + count` of the sequence whose KV is at `regions`
/// (host addresses, one per region) through `block_table`, with only `tokens` copied (every
/// other position is zero).
#[pyfunction]
pub(crate) fn gather_host<'py>(
    py: Python<'py>,
    layout: &Layout,
    regions: Vec<u64>,
    block_table: Vec<u32>,
    tokens: (usize, usize),
    first_page: usize,
    count: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let (tokens, pages) = (tokens.0..tokens.1, first_page..first_page + count);
    layout.check(&regions, &block_table, &tokens, &pages)?;
    Ok(PyBytes::new(py, &gather_bytes(layout, &regions, &block_table, tokens, pages)?))
}

/// The gather of [`gather_host`], arguments checked already.
pub(crate) fn gather_bytes(
    layout: &Layout,
    regions: &[u64],
    block_table: &[u32],
    tokens: Range<usize>,
    pages: Range<usize>,
) -> PyResult<Vec<u8>> {
    match layout.elem_bytes {
        2 => host_copy::<u16>(Direction::Gather, layout, regions, block_table, tokens, pages, None),
        _ => host_copy::<u32>(Direction::Gather, layout, regions, block_table, tokens, pages, None),
    }
}

/// Writes canonical pages `first_page ..` (`pages`, back to back) into the engine memory at
/// `regions`: only the positions `tokens` of the sequence; every other element stays as it was.
#[pyfunction]
pub(crate) fn scatter_host(
    layout: &Layout,
    regions: Vec<u64>,
    block_table: Vec<u32>,
    tokens: (usize, usize),
    first_page: usize,
    pages: &[u8],
) -> PyResult<()> {
    let page_bytes = layout.page_bytes_usize();
    if !pages.len().is_multiple_of(page_bytes) {
        return Err(PyValueError::new_err(format!("{} bytes of pages of {page_bytes}", pages.len())));
    }
    let range = first_page..first_page + pages.len() / page_bytes;
    let tokens = tokens.0..tokens.1;
    layout.check(&regions, &block_table, &tokens, &range)?;
    match layout.elem_bytes {
        2 => {
            host_copy::<u16>(Direction::Scatter, layout, &regions, &block_table, tokens, range, Some(pages))?
        }
        _ => {
            host_copy::<u32>(Direction::Scatter, layout, &regions, &block_table, tokens, range, Some(pages))?
        }
    };
    Ok(())
}

/// The scatter of [`scatter_host`] from a load's task, arguments checked already.
pub(crate) fn scatter_bytes(
    layout: &Layout,
    regions: &[u64],
    block_table: &[u32],
    tokens: Range<usize>,
    first_page: usize,
    pages: &[u8],
) -> Result<(), String> {
    let page_bytes = layout.page_bytes_usize();
    let range = first_page..first_page + pages.len() / page_bytes;
    let copied = match layout.elem_bytes {
        2 => host_copy::<u16>(Direction::Scatter, layout, regions, block_table, tokens, range, Some(pages)),
        _ => host_copy::<u32>(Direction::Scatter, layout, regions, block_table, tokens, range, Some(pages)),
    };
    copied.map(drop).map_err(|e| e.to_string())
}

/// An element of the KV dtype, as raw bits.
trait Word: Copy + Default {
    fn to_le(self, out: &mut Vec<u8>);
    fn from_le(bytes: &[u8]) -> Self;
}

impl Word for u16 {
    fn to_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn from_le(b: &[u8]) -> Self {
        u16::from_le_bytes([b[0], b[1]])
    }
}

impl Word for u32 {
    fn to_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn from_le(b: &[u8]) -> Self {
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// One CPU copy between engine memory and pages (given for a scatter, returned for a gather).
fn host_copy<T: Word>(
    direction: Direction,
    layout: &Layout,
    regions: &[u64],
    block_table: &[u32],
    tokens: Range<usize>,
    pages: Range<usize>,
    input: Option<&[u8]>,
) -> PyResult<Vec<u8>> {
    let es = std::mem::size_of::<T>();
    let len = layout.desc.region_len;
    let mut spans: Vec<(u64, u64)> = regions.iter().map(|&a| (a, a + (len * es) as u64)).collect();
    if regions.iter().any(|a| a % es as u64 != 0) {
        return Err(PyValueError::new_err(format!("a region address not aligned to {es} bytes")));
    }
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(PyValueError::new_err("region addresses that overlap"));
    }
    let page_elems = layout.shape().page_elems();
    let mut words: Vec<T> = match input {
        Some(bytes) => bytes.chunks_exact(es).map(T::from_le).collect(),
        None => vec![T::default(); pages.len() * page_elems],
    };
    // SAFETY: the caller (the connector) names live host tensors of the engine, each at least
    // `region_bytes` long (what the layout was built from), which nothing else writes while
    // this call runs (the engine is not computing on those blocks); the addresses are aligned
    // and the regions disjoint (checked above), so the slices neither misalign nor alias.
    let mut slices: Vec<&mut [T]> =
        regions.iter().map(|&a| unsafe { std::slice::from_raw_parts_mut(a as *mut T, len) }).collect();
    copy_token_pages(direction, &layout.desc, &mut slices, block_table, tokens, pages, &mut words);
    let mut out = Vec::new();
    if direction == Direction::Gather {
        out.reserve(words.len() * es);
        for w in words {
            w.to_le(&mut out);
        }
    }
    Ok(out)
}
