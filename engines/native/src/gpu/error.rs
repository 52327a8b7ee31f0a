//! Why the GPU backend could not load or run.

/// Why the GPU backend could not load or run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GpuError {
    /// The driver or NVRTC is missing, or the GPU could not be opened.
    #[error(transparent)]
    Setup(#[from] xinf_transfer::gpu::GpuError),
    /// cuBLAS could not be loaded.
    #[error("cuBLAS could not be loaded (libcublas.so.13; add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)")]
    NoCublas,
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Driver(String),
    /// A cuBLAS call failed.
    #[error("cuBLAS: {0}")]
    Blas(String),
    /// The kernels did not compile.
    #[error("NVRTC: {0}")]
    Compile(String),
    /// The model has a shape the kernels do not handle.
    #[error("unsupported on the GPU: {0}")]
    Unsupported(String),
    /// The weights could not be converted for upload.
    #[error("weights: {0}")]
    Weights(String),
    /// A step or page range does not fit the cache or the model.
    #[error("{0}")]
    Shape(String),
}

pub(super) fn driver(e: impl std::fmt::Display) -> GpuError {
    GpuError::Driver(e.to_string())
}

impl From<super::plan::ShapeError> for GpuError {
    fn from(e: super::plan::ShapeError) -> Self {
        match e {
            super::plan::ShapeError::Unsupported(m) => Self::Unsupported(m),
            super::plan::ShapeError::Layout(m) => Self::Shape(m),
        }
    }
}
