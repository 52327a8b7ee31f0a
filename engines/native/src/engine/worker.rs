//! The compute thread. It owns the model and the cache, takes the handle's commands, and runs
//! steps: it carries out the scheduler's decisions on the cache, runs the planned chunks
//! through the model, samples, and streams every token to its request. It stops once every
//! handle is gone and no request is left.

use super::scheduler::{self, Admission, Limits, Plan, Work};
use super::seq::{Mode, PinnedReply, Seq};
use super::shared::{Command, Shared, dequeued};
use super::step_trace::{StepTimes, trace_step};
use crate::grammar::{Constraint, Mask};
use crate::kv_cache::KvCache;
use crate::model::{Chunk, ComputeBackend, Row};
use crate::options::EngineOptions;
use crate::stop::StopOutcome;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use xinf_engine::{
    EngineError, FinishReason, KvPages, PAGE_TOKENS, PinnedPrefill, TokenEvent, TokenLogprobs, Usage,
};
use xinf_models::TextTokenizer;
use xinf_transfer::device::{DeviceLease, DeviceRoute};
use xinf_transfer::sync::lock;

/// A planned part's grammar mask, computed beside the forward pass; `None` for a part without
/// a grammar or that samples nothing this step.
type StepMask = Option<Result<Mask, String>>;

/// The compute thread's state.
pub(super) struct Worker {
    backend: Box<dyn ComputeBackend>,
    cache: KvCache,
    rx: std_mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    waiting: VecDeque<Box<Seq>>,
    /// Boxed like `waiting`: sequences move between the two as pointers (preemption, admission).
    #[allow(clippy::vec_box)]
    running: Vec<Box<Seq>>,
    /// Prompts held for export: (blocks, prompt length).
    pinned: HashMap<String, (Vec<u32>, usize)>,
    options: EngineOptions,
    tokenizer: Arc<TextTokenizer>,
    /// When the last step ended, for the step trace.
    last_step: Option<std::time::Instant>,
}

impl Worker {
    pub(super) fn new(
        backend: Box<dyn ComputeBackend>,
        cache: KvCache,
        rx: std_mpsc::Receiver<Command>,
        shared: Arc<Shared>,
        options: EngineOptions,
        tokenizer: Arc<TextTokenizer>,
    ) -> Self {
        let (waiting, running, pinned) = (VecDeque::new(), Vec::new(), HashMap::new());
        Self { backend, cache, rx, shared, waiting, running, pinned, options, tokenizer, last_step: None }
    }

    /// Starts the compute thread. It ends once every handle is gone and no request is left,
    /// after freeing what the worker holds (on a GPU its memory, graphs and streams).
    pub(super) fn spawn(mut self) -> Result<std::thread::JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name("xinf-native-engine".into())
            .spawn(move || self.run())
            .map_err(|e| EngineError::Internal(format!("starting the engine thread: {e}")))
    }

    fn run(&mut self) {
        while self.take_commands() {
            self.drop_disconnected();
            self.step();
            self.publish();
        }
    }

    fn idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    fn limits(&self) -> Limits {
        Limits { max_num_seqs: self.options.max_num_seqs, max_batch_tokens: self.options.max_batch_tokens }
    }

    /// Handles every command sent so far, waiting for one first when there is nothing to
    /// compute; `false` once every handle is gone and no request is left.
    fn take_commands(&mut self) -> bool {
        if self.idle() {
            match self.rx.recv() {
                Ok(c) => self.handle(c),
                Err(_) => return false,
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(c) => self.handle(c),
                Err(std_mpsc::TryRecvError::Empty) => return true,
                Err(std_mpsc::TryRecvError::Disconnected) => return !self.idle(),
            }
        }
    }

    fn publish(&self) {
        let s = &self.shared;
        s.running.store(self.running.len(), Ordering::Relaxed);
        // `queued` is counted by its submitters and by admission, not stored here: a request
        // in the command channel is queued but not yet in `waiting`.
        s.used_blocks.store(self.cache.capacity_blocks() - self.cache.free_blocks(), Ordering::Relaxed);
        s.pinned_blocks.store(self.pinned.values().map(|p| p.0.len()).sum(), Ordering::Relaxed);
    }

    fn handle(&mut self, c: Command) {
        match c {
            Command::Submit(seq) => self.waiting.push_back(seq),
            Command::Abort(id) => self.abort(&id),
            Command::Release(id) => {
                if let Some((mut table, _)) = self.pinned.remove(&id) {
                    self.cache.release(&mut table);
                }
                self.publish();
            }
            Command::Export { id, first, count, reply } => {
                let _ = reply.send(self.export(id, first, count));
            }
            Command::ExportDevice { id, first, count, route, reply } => {
                let _ = reply.send(self.export_device(id, first, count, route));
            }
            Command::Logits { ids, reply } => {
                let _ = reply.send(self.logits(&ids));
            }
        }
    }

    fn abort(&mut self, id: &str) {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let s = self.running.remove(i);
            self.finish(s, Some(FinishReason::Abort), None);
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id)
            && let Some(s) = self.waiting.remove(i)
        {
            dequeued(&self.shared.queued);
            self.finish(s, Some(FinishReason::Abort), None);
        }
    }

    /// Pages `first..first + count` of pinned prompt `id`, copied to host memory.
    fn export(&mut self, id: String, first: usize, count: usize) -> Result<Vec<u8>, EngineError> {
        let (table, len) = self.pinned_range(id, first, count)?;
        self.backend
            .export_pages(&mut self.cache, &table, len, first, count)
            .map_err(|e| EngineError::Internal(format!("exporting KV pages: {e}")))
    }

    /// Pages `first..first + count` of pinned prompt `id`, gathered into GPU staging memory.
    fn export_device(
        &mut self,
        id: String,
        first: usize,
        count: usize,
        route: DeviceRoute,
    ) -> Result<DeviceLease, EngineError> {
        let (table, len) = self.pinned_range(id, first, count)?;
        self.backend
            .export_device(&table, len, first, count, route)
            .map_err(|e| EngineError::Internal(format!("exporting KV pages to GPU staging: {e}")))
    }

    /// The logits after the last of `ids`, computed alone into blocks given back at once.
    fn logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut table = Vec::new();
        let result = if self.cache.ensure(&mut table, ids.len()) {
            let chunk = Chunk {
                tokens: ids,
                start: 0,
                block_table: &table,
                want_logits: true,
                all_logits: false,
                prompt_len: ids.len(),
                argmax: false,
            };
            self.backend
                .forward(&[chunk], &mut self.cache)
                .map_err(|e| EngineError::Internal(e.to_string()))
                .and_then(|mut rows| rows.pop().ok_or_else(|| EngineError::Internal("no logits".into())))
        } else {
            Err(EngineError::Overloaded { queued: self.waiting.len(), limit: self.options.max_queue })
        };
        self.cache.release(&mut table);
        result
    }

    /// The block table and length of pinned prompt `id`, if pages `first..first + count` exist.
    fn pinned_range(&self, id: String, first: usize, count: usize) -> Result<(Vec<u32>, usize), EngineError> {
        let Some((table, len)) = self.pinned.get(&id) else { return Err(EngineError::UnknownRequest(id)) };
        let pages = len.div_ceil(PAGE_TOKENS);
        if first + count > pages {
            return Err(EngineError::invalid(
                "pages",
                format!("pages {first}..{} requested of a {pages}-page prompt", first + count),
            ));
        }
        Ok((table.clone(), *len))
    }

    /// Requests whose client went away are aborted.
    fn drop_disconnected(&mut self) {
        let gone: Vec<String> = self
            .running
            .iter()
            .chain(self.waiting.iter())
            .filter(|s| s.tx.is_closed())
            .map(|s| s.id.clone())
            .collect();
        for id in gone {
            self.abort(&id);
        }
    }

    /// Ends a sequence: frees or pins its blocks, reports, forgets its id.
    fn finish(&mut self, mut s: Box<Seq>, reason: Option<FinishReason>, error: Option<EngineError>) {
        lock(&self.shared.active).remove(&s.id);
        let aborted = reason == Some(FinishReason::Abort);
        let pinned = matches!(s.mode, Mode::Pinned(_));
        // Free before reporting, and publish the counters before the client hears the end.
        if !pinned || error.is_some() || aborted {
            self.cache.release(&mut s.table);
            self.publish();
        }
        let reply = match &mut s.mode {
            Mode::Pinned(reply) => reply.take(),
            Mode::Generate => None,
        };
        match (pinned, error) {
            (true, None) if !aborted => self.pin(&mut s, reply),
            (true, error) => {
                if let Some(r) = reply {
                    let _ = r.send(Err(error.unwrap_or(EngineError::Aborted)));
                }
            }
            (false, Some(e)) => {
                let _ = s.tx.send(Err(e));
            }
            (false, None) => end_stream(&mut s, reason),
        }
    }

    /// Keeps a prefilled prompt's blocks for export and answers `reply` with its first token;
    /// frees the blocks again when nobody waits for the answer any more.
    fn pin(&mut self, s: &mut Seq, reply: Option<PinnedReply>) {
        let first_token = s.tokens.get(s.prompt_len).copied().unwrap_or_default();
        // Shown before the decode side answers only when nothing could hold it back or end it.
        let first_text = (!s.stop.has_stops() && !s.stop_ids.contains(&first_token))
            .then(|| s.detok.step(&self.tokenizer, &s.tokens))
            .filter(|t| !t.is_empty());
        let pinned = PinnedPrefill {
            request_id: s.id.clone(),
            prompt_ids: s.tokens[..s.prompt_len].to_vec(),
            first_token,
            first_text,
            first_logprobs: s.first_logprobs.take(),
            prompt: s.prompt.as_mut().and_then(|t| t.report(&s.tokens[..s.prompt_len], &self.tokenizer)),
            remote: None,
        };
        let table = std::mem::take(&mut s.table);
        lock(&self.shared.pinned).insert(s.id.clone());
        self.pinned.insert(s.id.clone(), (table, s.prompt_len));
        // Counters first: whoever gets the reply may look at them at once.
        self.publish();
        if let Some(r) = reply
            && r.send(Ok(pinned)).is_err()
        {
            lock(&self.shared.pinned).remove(&s.id);
            if let Some((mut t, _)) = self.pinned.remove(&s.id) {
                self.cache.release(&mut t);
            }
        }
    }

    /// Moves waiting sequences into the running set while memory and limits allow, writing
    /// imported KV into the blocks they were given.
    fn admit(&mut self) {
        let limits = self.limits();
        while let Some(admission) =
            scheduler::admit_next(&mut self.waiting, &self.running, &mut self.cache, limits)
        {
            dequeued(&self.shared.queued);
            match admission {
                Admission::Admitted(s) => self.start(s),
                Admission::TooLarge(s) => {
                    let e = EngineError::invalid("prompt", "the prompt does not fit in the KV cache");
                    self.finish(s, None, Some(e));
                }
            }
        }
    }

    /// Runs an admitted sequence, its imported pages (if any) scattered into its blocks first.
    fn start(&mut self, mut s: Box<Seq>) {
        if let Some(import) = s.import.take() {
            let written = match &import.pages {
                KvPages::Host(bytes) => {
                    self.backend.import_pages(&mut self.cache, &s.table, import.tokens, bytes)
                }
                KvPages::Device(pages) => self.backend.import_device(&s.table, import.tokens, pages),
            };
            if let Err(e) = written {
                self.finish(s, None, Some(EngineError::Import(format!("writing the KV pages: {e}"))));
                return;
            }
            s.computed = import.tokens;
        } else if s.computed > 0 {
            self.shared.cached_prompt_tokens.fetch_add(s.computed as u64, Ordering::Relaxed);
        }
        self.running.push(s);
    }

    fn step(&mut self) {
        self.emit_presets();
        self.admit();
        if self.running.is_empty() {
            return;
        }
        let limits = self.limits();
        let work = match scheduler::plan(&mut self.running, &mut self.waiting, &mut self.cache, limits) {
            Plan::Run(work) => work,
            Plan::Preempted => {
                self.shared.queued.fetch_add(1, Ordering::Relaxed);
                return self.publish();
            }
            Plan::Overflow(s) => {
                let e = EngineError::invalid("prompt", "the sequence no longer fits in the KV cache");
                return self.finish(s, None, Some(e));
            }
        };
        let started = std::time::Instant::now();
        let mut sampled = started;
        if let Some((logits, masks)) = self.forward(&work) {
            sampled = std::time::Instant::now();
            self.sample(&work, logits, masks);
        }
        let ended = std::time::Instant::now();
        let between = self.last_step.map(|e| started.duration_since(e));
        self.last_step = Some(ended);
        trace_step(&work, StepTimes { took: ended - started, sample: ended - sampled, between });
    }

    /// Imported first tokens are emitted without compute.
    fn emit_presets(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if let Some((t, logprobs)) = self.running[i].preset.take()
                && let Some(end) = self.accept(i, t, logprobs)
            {
                let s = self.running.remove(i);
                self.end(s, end);
                continue;
            }
            i += 1;
        }
    }

    /// Computes the planned chunks in one forward, and the grammar masks of the rows it samples
    /// (aligned with `work`) beside it; `None` (every planned sequence failed) when it fails.
    fn forward(&mut self, work: &[Work]) -> Option<(Vec<Row>, Vec<StepMask>)> {
        // The grammars of the rows this step samples leave their sequences for the step: a
        // mask depends only on the tokens consumed so far, so another thread computes them
        // while the forward pass runs instead of after it.
        let mut grammars: Vec<(usize, Constraint)> = Vec::new();
        for (k, w) in work.iter().enumerate() {
            let s = &mut self.running[w.seq];
            if s.computed + w.tokens == s.tokens.len()
                && let Some(c) = s.constraint.take()
            {
                grammars.push((k, c));
            }
        }
        let chunks: Vec<Chunk<'_>> = work
            .iter()
            .enumerate()
            .map(|(k, w)| {
                let s = &self.running[w.seq];
                let constrained = s.constraint.is_some() || grammars.iter().any(|(j, _)| *j == k);
                Chunk {
                    tokens: &s.tokens[s.computed..s.computed + w.tokens],
                    start: s.computed,
                    block_table: &s.table,
                    want_logits: s.computed + w.tokens == s.tokens.len(),
                    all_logits: s.wants_prompt_logits(),
                    prompt_len: s.prompt_len,
                    // Log-probabilities and structured output need the whole row.
                    argmax: s.sampler.is_argmax() && s.logprobs.is_none() && !constrained && !s.holds_stops(),
                }
            })
            .collect();
        let (backend, cache) = (&mut self.backend, &mut self.cache);
        let (result, computed) = std::thread::scope(|scope| {
            let masks = (!grammars.is_empty())
                .then(|| scope.spawn(|| grammars.iter_mut().map(|(_, c)| c.allowed()).collect::<Vec<_>>()));
            let result = backend.forward_step(&chunks, cache);
            (result, masks.map(|h| h.join()))
        });
        drop(chunks);
        let mut masks: Vec<StepMask> = (0..work.len()).map(|_| None).collect();
        // A grammar that panicked leaves no masks: its sequences fail, not the engine.
        let mut computed = match computed {
            Some(Ok(list)) => list,
            _ => Vec::new(),
        }
        .into_iter();
        for (k, c) in grammars {
            masks[k] = Some(computed.next().unwrap_or_else(|| Err("the grammar failed".to_owned())));
            self.running[work[k].seq].constraint = Some(c);
        }
        match result {
            Ok(logits) => Some((logits, masks)),
            Err(e) => {
                let msg = format!("forward pass failed: {e}");
                tracing::error!("{msg}");
                // By falling index: the plan lists decodes first, so its order is not the
                // order of `running`, and removing a lower index first would shift the others.
                let mut failed: Vec<usize> = work.iter().map(|w| w.seq).collect();
                failed.sort_unstable_by(|a, b| b.cmp(a));
                failed.dedup();
                for idx in failed {
                    let s = self.running.remove(idx);
                    self.finish(s, None, Some(EngineError::Internal(msg.clone())));
                }
                None
            }
        }
    }

    /// Advances every planned sequence past what the step computed, and samples the next
    /// token of those whose last known token was computed.
    fn sample(&mut self, work: &[Work], logits: Vec<Row>, mut masks: Vec<StepMask>) {
        let mut logits = logits.into_iter();
        let mut finished = Vec::new();
        for (k, w) in work.iter().enumerate() {
            let s = &mut self.running[w.seq];
            let was_prompt = s.computed < s.prompt_len;
            let start = s.computed;
            // Such a chunk's rows are every position's, the last one the row to sample from.
            let every_row = s.wants_prompt_logits().then(|| {
                let rows: Vec<Row> = logits.by_ref().take(w.tokens).collect();
                if let Some(t) = s.prompt.as_mut() {
                    t.tally(&s.tokens, s.prompt_len, start, &rows, &self.tokenizer);
                }
                rows
            });
            s.computed += w.tokens;
            self.cache.blocks().publish(&s.tokens, s.prompt_len, s.computed, &s.table, &mut s.block_keys);
            if was_prompt {
                self.shared.prompt_tokens.fetch_add(w.tokens.min(s.prompt_len) as u64, Ordering::Relaxed);
            }
            if s.computed < s.tokens.len() {
                continue;
            }
            let row = match every_row {
                Some(mut rows) => rows.pop(),
                None => logits.next(),
            };
            let (token, logprobs) = match row {
                Some(Row::Logits(mut row)) => {
                    // The raw row, before the grammar, penalties and temperature change it.
                    let raw = s.logprobs.map(|top| (row.clone(), top));
                    // Under a grammar, its end decides when the output may stop.
                    if s.holds_stops() && s.constraint.is_none() {
                        for &id in &s.stop_ids {
                            if let Some(l) = row.get_mut(id as usize) {
                                *l = f32::NEG_INFINITY;
                            }
                        }
                    }
                    let masked = match (masks.get_mut(k).and_then(Option::take), s.constraint.as_mut()) {
                        (Some(mask), _) => mask.map(|m| m.apply(&mut row)),
                        (None, Some(c)) => c.mask(&mut row),
                        (None, None) => Ok(()),
                    };
                    if let Err(e) = masked {
                        finished.push((w.seq, Err(grammar_failed(e))));
                        continue;
                    }
                    let (prompt, output) = s.tokens.split_at(s.prompt_len);
                    let token = s.sampler.sample(&mut row, prompt, output);
                    let logprobs = raw.map(|(raw, top)| {
                        Box::new(crate::logprobs::token_logprobs(&raw, token, top, &self.tokenizer))
                    });
                    (token, logprobs)
                }
                Some(Row::Argmax(token)) => (token, None),
                None => continue,
            };
            if let Some(end) = self.accept(w.seq, token, logprobs) {
                finished.push((w.seq, end));
            }
        }
        finished.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (idx, end) in finished {
            let s = self.running.remove(idx);
            self.end(s, end);
        }
    }

    /// Ends a sequence the way [`accept`](Self::accept) or the grammar decided.
    fn end(&mut self, s: Box<Seq>, end: Result<FinishReason, EngineError>) {
        match end {
            Ok(reason) => self.finish(s, Some(reason), None),
            Err(e) => self.finish(s, None, Some(e)),
        }
    }

    /// Appends a sampled token to a running sequence and streams it; returns how the sequence
    /// ends, if it does.
    fn accept(
        &mut self,
        idx: usize,
        token: u32,
        logprobs: Option<Box<TokenLogprobs>>,
    ) -> Option<Result<FinishReason, EngineError>> {
        self.shared.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let s = &mut self.running[idx];
        s.tokens.push(token);
        let generated = s.tokens.len() - s.prompt_len;
        // Every output token moves the grammar on, an imported first token included.
        let shape_done = match s.constraint.as_mut().map(|c| c.advance(token).map(|()| c.is_done())) {
            Some(Err(e)) => return Some(Err(grammar_failed(e))),
            Some(Ok(done)) => done,
            None => false,
        };
        if matches!(s.mode, Mode::Pinned(_)) {
            s.first_logprobs = logprobs;
            return Some(Ok(FinishReason::Length));
        }
        if let Some(report) =
            s.prompt.as_mut().and_then(|t| t.report(&s.tokens[..s.prompt_len], &self.tokenizer))
            && s.tx.send(Ok(TokenEvent::Prompt(report))).is_err()
        {
            return Some(Ok(FinishReason::Abort));
        }
        let is_stop_token = s.stop_ids.contains(&token);
        let text = if is_stop_token { String::new() } else { s.detok.step(&self.tokenizer, &s.tokens) };
        let (emit, stopped) = match s.stop.push(&text) {
            StopOutcome::Continue { emit } => (emit, false),
            StopOutcome::Stopped { emit } => (emit, true),
        };
        if s.tx.send(Ok(TokenEvent::Delta { token_id: token, text: emit, logprobs })).is_err() {
            return Some(Ok(FinishReason::Abort));
        }
        if stopped || is_stop_token || shape_done {
            Some(Ok(FinishReason::Stop))
        } else if generated >= s.max_tokens {
            Some(Ok(FinishReason::Length))
        } else {
            None
        }
    }
}

/// A grammar that could not go on (its limits reached, or a token it did not allow).
fn grammar_failed(e: String) -> EngineError {
    EngineError::invalid("response_format", format!("the output's grammar could not go on: {e}"))
}

/// Streams what the stop matcher still holds (unless a stop string ended the sequence) and the
/// end of a generating sequence.
fn end_stream(s: &mut Seq, reason: Option<FinishReason>) {
    let usage = Usage { prompt_tokens: s.prompt_len, completion_tokens: s.tokens.len() - s.prompt_len };
    let tail = s.stop.flush();
    if !tail.is_empty() && reason != Some(FinishReason::Stop) {
        let last = s.tokens.last().copied().unwrap_or_default();
        let _ = s.tx.send(Ok(TokenEvent::Delta { token_id: last, text: tail, logprobs: None }));
    }
    let _ = s.tx.send(Ok(TokenEvent::Finished { reason: reason.unwrap_or(FinishReason::Stop), usage }));
}
