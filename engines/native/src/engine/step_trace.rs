//! The step trace: each step's shape and where its host time went, logged at trace level under
//! `xinf::step` for `doc/bench/gpu/steps.py`.

use super::scheduler::Work;

/// Each step's shape and time, at trace level under the target `xinf::step`
/// (`XINF_LOG=xinf::step=trace`): where a serving run's time goes, step by step, for
/// `doc/bench/gpu/steps.py`. A step's time runs from its forward pass to its last token sampled
/// (on a GPU, past the step's one synchronisation); `sample_us` is the part after the forward
/// pass (sampling, stops, streaming), and `between_us` the host's time since the step before
/// ended (commands, admission, planning; idle waits too, so read it in busy stretches).
pub(super) fn trace_step(work: &[Work], times: StepTimes) {
    if tracing::enabled!(target: "xinf::step", tracing::Level::TRACE) {
        let decodes = work.iter().filter(|w| w.tokens == 1).count();
        let prompt_tokens: usize = work.iter().filter(|w| w.tokens > 1).map(|w| w.tokens).sum();
        let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let (us, sample_us) = (micros(times.took), micros(times.sample));
        let between_us = times.between.map_or(0, micros);
        tracing::trace!(
            target: "xinf::step",
            seqs = work.len(),
            decodes,
            prompt_tokens,
            us,
            sample_us,
            between_us,
            "step"
        );
    }
}

/// Where a step's host time went, for [`trace_step`].
pub(super) struct StepTimes {
    /// From the forward pass to the last token sampled.
    pub(super) took: std::time::Duration,
    /// Of it, after the forward pass.
    pub(super) sample: std::time::Duration,
    /// Since the step before ended; `None` for the first step.
    pub(super) between: Option<std::time::Duration>,
}
