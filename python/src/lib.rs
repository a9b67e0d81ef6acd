//! `kvslim._native`: the Rust half of the `kvslim` Python package.
//!
//! Each function calls the engine the way the CLI does (`crates/cli`) and
//! hands back plain Python values (dicts, lists, floats); the pure-Python
//! layer (`python/kvslim/__init__.py`) wraps them in dataclasses and numpy
//! arrays. The GIL is released while the engine runs, and every error
//! becomes a Python exception carrying the Rust message: `ValueError` for
//! bad input (policy specs, task specs, model files, tokens),
//! `FileNotFoundError` / `OSError` for files, `RuntimeError` for the rest.

use kvslim_cache::policy::chai::{CalibrationConfig, PlanError};
use kvslim_cache::{KvBytes, KvDtype, PolicySpec};
use kvslim_engine::calibrate::{calibrate, calibration_windows, CalibrateOptions};
use kvslim_engine::context::{Context as EngineContext, Framing, Question};
use kvslim_engine::{
    generate, perplexity, speculative_run, CopyThenModel, DraftLength, Drafter, EngineError, GenerateOptions,
    ModelDrafter, NgramDrafter, PerplexityOptions, SamplingParams, Verification,
};
use kvslim_eval::{run_matrix, EvalError, MatrixConfig, ScoreMode, TaskSpec};
use kvslim_models::chat::{ChatFormat, ChatMessage};
use kvslim_models::{LoadedModel, Tokenizer};
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

// ---------------------------------------------------------------- errors

fn value_error(msg: impl ToString) -> PyErr {
    PyValueError::new_err(msg.to_string())
}

fn io_error(msg: String, kind: std::io::ErrorKind) -> PyErr {
    match kind {
        std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
        _ => PyOSError::new_err(msg),
    }
}

fn model_error(e: kvslim_models::Error) -> PyErr {
    use kvslim_cache::CacheError;
    use kvslim_models::Error as E;
    let msg = e.to_string();
    match e {
        E::Io { source, .. } => io_error(msg, source.kind()),
        E::Kernel(_) | E::Cache(CacheError::Full(_) | CacheError::MissingKeys { .. } | CacheError::Truncate(_)) => {
            PyRuntimeError::new_err(msg)
        }
        // bad model files, tokens, or a CHAI plan that does not fit the model
        _ => PyValueError::new_err(msg),
    }
}

fn engine_error(e: EngineError) -> PyErr {
    match e {
        EngineError::Model(m) => model_error(m),
        EngineError::Request(r) => PyValueError::new_err(r),
        // the keyword arguments are named as the engine's fields
        EngineError::Setting(s) => PyValueError::new_err(s.message(s.setting.field())),
    }
}

fn eval_error(e: EvalError) -> PyErr {
    match e {
        EvalError::Io { ref source, .. } => io_error(e.to_string(), source.kind()),
        EvalError::Engine(e) => engine_error(e),
        EvalError::Model(m) => model_error(m),
        other => value_error(other),
    }
}

fn parse_policy(spec: &str) -> PyResult<PolicySpec> {
    PolicySpec::parse_and_load(spec).map_err(value_error)
}

// ------------------------------------------------------ JSON to Python

/// A JSON value as the Python value `json.loads` would give.
fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(a) => PyList::new(py, a.iter().map(|x| to_py(py, x)).collect::<PyResult<Vec<_>>>()?)?.into_any(),
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

fn json_of(v: &impl serde::Serialize) -> PyResult<Value> {
    serde_json::to_value(v).map_err(|e| PyRuntimeError::new_err(format!("cannot serialize a result: {e}")))
}

// ----------------------------------------------------------------- Model

/// A loaded model and its tokenizer (read-only; safe to share between
/// Python threads).
#[pyclass(frozen, module = "kvslim._native")]
struct Model {
    loaded: LoadedModel,
    spec: String,
    path: PathBuf,
    /// The `tokenizer=` file, if one was given.
    tokenizer_path: Option<PathBuf>,
    /// The chat format, read on first use ([`Model::chat_format`]).
    chat: OnceLock<ChatFormat>,
}

impl Model {
    fn tokenizer(&self) -> PyResult<&Tokenizer> {
        self.loaded
            .tokenizer
            .as_ref()
            .ok_or_else(|| value_error(format!("{} has no tokenizer; pass tokenizer=PATH", self.spec)))
    }

    /// The model's chat template (or the plain fallback), found as the CLI
    /// finds it (`ModelArgs::chat_format`): the tokenizer's template, with
    /// the BOS/EOS strings of the `tokenizer_config.json` beside the
    /// `tokenizer=` file or in the model's directory. Read once.
    fn chat_format(&self) -> PyResult<&ChatFormat> {
        if let Some(c) = self.chat.get() {
            return Ok(c);
        }
        let tok = self.tokenizer()?;
        let dir = match &self.tokenizer_path {
            Some(t) => t.parent().map(Path::to_path_buf),
            None if self.path.is_dir() => Some(self.path.clone()),
            None => None,
        };
        let config = dir.map(|d| d.join("tokenizer_config.json")).filter(|p| p.exists());
        let chat =
            ChatFormat::for_tokenizer(tok, config.as_deref(), &self.path.display().to_string()).map_err(value_error)?;
        Ok(self.chat.get_or_init(|| chat))
    }
}

/// Runs engine work with the GIL released, on a worker of the engine's
/// thread pool ([`kvslim_engine::on_workers`]: parallel products then
/// start at once instead of waking the pool each time).
fn run_detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    py.detach(|| kvslim_engine::on_workers(f))
}

#[pymethods]
impl Model {
    /// Loads a model: a path (HF directory, `.gguf`, llama2.c `.bin`),
    /// `hf:org/repo[/file]`, or an alias (`smollm2-135m`, `stories260k`).
    /// `f32_activations=True` multiplies quantized weights with f32
    /// activations (results equal the dequantized model's to rounding)
    /// instead of the faster 8-bit activations (the CLI's
    /// `--f32-activations`).
    #[new]
    #[pyo3(signature = (model, tokenizer=None, f32_activations=false))]
    fn new(py: Python<'_>, model: String, tokenizer: Option<PathBuf>, f32_activations: bool) -> PyResult<Self> {
        py.detach(|| {
            let path = kvslim_hub::resolve_model(&model).map_err(|e| PyFileNotFoundError::new_err(e.to_string()))?;
            let mut loaded = kvslim_models::load_model(&path).map_err(model_error)?;
            if f32_activations {
                loaded.model.weights.set_products(kvslim_kernels::Products::F32);
            }
            if let Some(t) = &tokenizer {
                let c = &loaded.model.config;
                loaded.tokenizer = Some(
                    kvslim_models::loader::load_tokenizer(t, c.bos_token_id, c.eos_token_ids.clone())
                        .map_err(model_error)?,
                );
                kvslim_models::loader::set_repeat_prompt(&mut loaded);
            }
            Ok(Model { loaded, spec: model, path, tokenizer_path: tokenizer, chat: OnceLock::new() })
        })
    }

    /// The spec the model was loaded from.
    #[getter]
    fn spec(&self) -> &str {
        &self.spec
    }

    /// The resolved local path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Architecture and sizes.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.loaded.model.config;
        let d = PyDict::new(py);
        d.set_item("n_layers", c.n_layers)?;
        d.set_item("n_heads", c.n_heads)?;
        d.set_item("n_kv_heads", c.n_kv_heads)?;
        d.set_item("head_dim", c.head_dim)?;
        d.set_item("hidden_size", c.hidden_size)?;
        d.set_item("vocab_size", c.vocab_size)?;
        d.set_item("context_len", c.context_len)?;
        Ok(d)
    }

    /// Token ids of `text` (BOS as the tokenizer says).
    fn tokenize(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        let tok = self.tokenizer()?;
        py.detach(|| tok.encode(text)).map_err(model_error)
    }

    /// The text of token ids.
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        self.tokenizer()?.decode(&ids).map_err(model_error)
    }

    /// `kvslim generate --json`: a dict with `text`, `token_ids`,
    /// `prompt_token_ids`, `stop_reason`, timings and KV bytes; with
    /// `speculative` (greedy only) `generate --speculative ngram`, with a
    /// `draft_model` `generate --draft-model` (copies where the context
    /// matches, else the draft model's drafts under `draft_policy`, default
    /// `policy`): the same tokens, plus `speculative` (passes, drafted,
    /// accepted tokens).
    #[pyo3(signature = (prompt, max_tokens=128, policy="full", temperature=0.0, top_k=0, top_p=1.0, seed=0, speculative=false, draft_model=None, draft_policy=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt: &str,
        max_tokens: usize,
        policy: &str,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
        speculative: bool,
        draft_model: Option<PyRef<'py, Model>>,
        draft_policy: Option<&str>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let tok = self.tokenizer()?;
        let spec = parse_policy(policy)?;
        let draft = match &draft_model {
            Some(d) => {
                let dtok = d.tokenizer()?;
                if let Some(diff) = dtok.vocabulary_mismatch(tok) {
                    return Err(PyValueError::new_err(format!(
                        "draft_model does not share the model's vocabulary ({diff}): a draft model needs the target's \
                         tokenizer"
                    )));
                }
                Some((&d.loaded.model, draft_policy.map(parse_policy).transpose()?.unwrap_or_else(|| spec.clone())))
            }
            None if draft_policy.is_some() => return Err(PyValueError::new_err("draft_policy needs a draft_model")),
            None => None,
        };
        let opts = GenerateOptions {
            max_tokens,
            sampling: SamplingParams { temperature, top_k, top_p, seed },
            policy: spec,
            eos: tok.eos.clone(),
        };
        let model = &self.loaded.model;
        let (prompt_ids, g, stats, text) = run_detached(py, || -> PyResult<_> {
            let ids = tok.encode(prompt).map_err(model_error)?;
            let (g, stats) = if speculative || draft.is_some() {
                let mut drafter: Box<dyn Drafter> = match &draft {
                    Some((m, policy)) => {
                        Box::new(CopyThenModel::new(ModelDrafter::new(m, policy.clone(), ids.len() + max_tokens)))
                    }
                    None => Box::new(NgramDrafter::default()),
                };
                let run = speculative_run(
                    model,
                    &ids,
                    &opts,
                    drafter.as_mut(),
                    DraftLength::default(),
                    Verification::Auto,
                    |_| true,
                )
                .map_err(engine_error)?;
                (run.generation, Some(run.stats))
            } else {
                (generate(model, &ids, &opts, |_| true).map_err(engine_error)?, None)
            };
            let text = tok.decode(&g.token_ids).map_err(model_error)?;
            Ok((ids, g, stats, text))
        })?;
        let d = PyDict::new(py);
        d.set_item("text", text)?;
        d.set_item("token_ids", &g.token_ids)?;
        d.set_item("prompt_token_ids", prompt_ids)?;
        d.set_item("stop_reason", to_py(py, &json_of(&g.stop)?)?)?;
        d.set_item("policy", opts.policy.to_string())?;
        d.set_item("time_to_first_token_s", g.time_to_first_token_s)?;
        d.set_item("decode_s", g.decode_s)?;
        d.set_item("kv_bytes_allocated", g.kv_bytes.kv)?;
        d.set_item("kv_metadata_bytes", g.kv_bytes.metadata)?;
        let speculative = match stats {
            Some(s) => Some(to_py(py, &json_of(&s)?)?),
            None => None,
        };
        d.set_item("speculative", speculative)?;
        Ok(d)
    }

    /// `kvslim perplexity`: teacher-forced scoring of `text` (or `tokens`).
    /// Returns the CLI's JSON report as a dict plus `token_ids`,
    /// `logprobs`, `kept` (positions per layer and KV head after the last
    /// token) and `kept_scores` (their accumulated scores).
    #[pyo3(signature = (text=None, tokens=None, policy="full", max_tokens=None, prefill=0, compare_full=false, decisions_from=None))]
    #[allow(clippy::too_many_arguments)]
    fn perplexity<'py>(
        &self,
        py: Python<'py>,
        text: Option<&str>,
        tokens: Option<Vec<u32>>,
        policy: &str,
        max_tokens: Option<usize>,
        prefill: usize,
        compare_full: bool,
        decisions_from: Option<&str>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut opts = PerplexityOptions::new(parse_policy(policy)?);
        opts.prefill = prefill;
        opts.compare_full = compare_full;
        opts.decisions_from = decisions_from
            .map(|d| d.parse::<KvDtype>().map_err(|e| value_error(format!("decisions_from: {e}"))))
            .transpose()?;
        opts.check_decisions_from().map_err(engine_error)?;
        let tok = match (text, &tokens) {
            (Some(_), Some(_)) => return Err(value_error("pass text or tokens, not both")),
            (None, None) => return Err(value_error("pass text or tokens")),
            (Some(_), None) => Some(self.tokenizer()?),
            (None, Some(_)) => None,
        };
        let (ids, r) = run_detached(py, || -> PyResult<_> {
            let mut ids = match (text, tok) {
                (Some(t), Some(tok)) => tok.encode(t).map_err(model_error)?,
                _ => tokens.unwrap_or_default(),
            };
            if let Some(n) = max_tokens {
                ids.truncate(n);
            }
            let r = perplexity(&self.loaded.model, &ids, &opts, |_, _| {}).map_err(engine_error)?;
            Ok((ids, r))
        })?;
        let d = to_py(py, &json_of(&r)?)?.cast_into::<PyDict>()?;
        d.set_item("token_ids", ids)?;
        d.set_item("logprobs", &r.logprobs)?;
        d.set_item("kept", &r.kept)?;
        d.set_item("kept_scores", &r.kept_scores)?;
        Ok(d)
    }

    /// `kvslim calibrate`: the offline half of CHAI. Cuts `text` into at
    /// most `samples` windows of `seq_len` tokens (BOS included), writes the plan to
    /// `out` and returns it as a dict.
    #[pyo3(signature = (text, out, samples=64, seq_len=128, probe=5, max_k=0, dense_layers=0, restarts=10, seed=0))]
    #[allow(clippy::too_many_arguments)]
    fn calibrate<'py>(
        &self,
        py: Python<'py>,
        text: &str,
        out: PathBuf,
        samples: usize,
        seq_len: usize,
        probe: usize,
        max_k: usize,
        dense_layers: usize,
        restarts: usize,
        seed: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let tok = self.tokenizer()?;
        if seq_len < probe {
            return Err(value_error(format!("seq_len {seq_len} is shorter than the probe ({probe})")));
        }
        let opts = CalibrateOptions {
            probe,
            config: CalibrationConfig { max_k, dense_layers, restarts, seed },
            model_name: self.spec.clone(),
            seq_len,
        };
        let plan = run_detached(py, || -> PyResult<_> {
            let ids = tok.encode(text).map_err(model_error)?;
            let windows = calibration_windows(&ids, tok.prepended_bos(), samples, seq_len).map_err(engine_error)?;
            let plan = calibrate(&self.loaded.model, &windows, &opts, |_, _| {}).map_err(engine_error)?;
            plan.save(&out).map_err(|e| match &e {
                PlanError::Write { source, .. } => io_error(e.to_string(), source.kind()),
                _ => PyOSError::new_err(e.to_string()),
            })?;
            Ok(plan)
        })?;
        to_py(py, &json_of(&plan)?)
    }

    /// `kvslim eval` on this model: every task × policy family × budget,
    /// one dict per cell (the rows of `results.jsonl`).
    #[pyo3(signature = (tasks, policies, budgets, label=None, limit=None, seq_len=None, mode="decode", compare_full=true, out=None))]
    #[allow(clippy::too_many_arguments)]
    fn eval<'py>(
        &self,
        py: Python<'py>,
        tasks: Vec<String>,
        policies: Vec<String>,
        budgets: Vec<String>,
        label: Option<String>,
        limit: Option<usize>,
        seq_len: Option<usize>,
        mode: &str,
        compare_full: bool,
        out: Option<PathBuf>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let tok = self.tokenizer()?;
        let specs = tasks
            .iter()
            .map(|t| TaskSpec::parse_with_defaults(t, limit, seq_len))
            .collect::<Result<Vec<_>, _>>()
            .map_err(eval_error)?;
        if specs.is_empty() {
            return Err(value_error("no task given"));
        }
        let mut cfg = MatrixConfig::new(label.as_deref().unwrap_or(&self.spec), specs);
        cfg.policies = policies;
        cfg.budgets = budgets;
        cfg.mode = mode.parse::<ScoreMode>().map_err(value_error)?;
        cfg.compare_full = compare_full;
        cfg.charts = out.is_some();
        cfg.out_dir = out;
        let rows = run_detached(py, || run_matrix(&self.loaded.model, tok, &cfg, |_| {})).map_err(eval_error)?;
        to_py(py, &json_of(&rows)?)
    }

    /// `kvslim compress`: prefills `text` once under `policy` and keeps
    /// the compressed cache. `chat=True` frames the text as the first user
    /// message of a chat (the model's template), after `system` if given,
    /// so questions follow as user turns.
    #[pyo3(signature = (text, policy="full", chat=false, system=None))]
    fn compress(
        slf: &Bound<'_, Self>,
        text: &str,
        policy: &str,
        chat: bool,
        system: Option<&str>,
    ) -> PyResult<Context> {
        let this = slf.get();
        if system.is_some() && !chat {
            return Err(value_error("system= needs chat=True (a system prompt frames a chat)"));
        }
        let spec = parse_policy(policy)?;
        let tok = this.tokenizer()?;
        let framing = if chat {
            let mut m: Vec<ChatMessage> = system.iter().map(|s| ChatMessage::new("system", *s)).collect();
            m.push(ChatMessage::new("user", text));
            Framing::Chat(m)
        } else {
            Framing::Text(text.to_string())
        };
        let (ctx, seconds) = run_detached(slf.py(), || -> PyResult<_> {
            // plain text does not read the template: a model whose
            // template does not parse still compresses text
            let format = if chat { this.chat_format()? } else { &ChatFormat::Plain };
            let start = Instant::now();
            let ctx = EngineContext::compress_framed(&this.loaded.model, &spec, tok, format, &framing)
                .map_err(engine_error)?;
            Ok((ctx, start.elapsed().as_secs_f64()))
        })?;
        Ok(Context::new(ctx, slf.clone().unbind(), Some(seconds)))
    }

    /// Reads a context written by `Context.save` (`kvslim compress -o`).
    /// `ValueError` names what is wrong with the file (truncated,
    /// corrupted, another model's, another format version).
    fn load_context(slf: &Bound<'_, Self>, path: PathBuf) -> PyResult<Context> {
        let this = slf.get();
        let ctx = run_detached(slf.py(), || -> PyResult<_> {
            let bytes =
                std::fs::read(&path).map_err(|e| io_error(format!("reading {}: {e}", path.display()), e.kind()))?;
            EngineContext::from_bytes(&this.loaded.model, &bytes)
                .map_err(|e| value_error(format!("{} is not a usable context: {e}", path.display())))
        })?;
        Ok(Context::new(ctx, slf.clone().unbind(), None))
    }
}

// --------------------------------------------------------------- Context

/// A question: text (a chat context's next user turn) or chat messages
/// as `(role, content)` pairs.
#[derive(FromPyObject)]
enum QuestionArg {
    Text(String),
    Messages(Vec<(String, String)>),
}

/// A compressed context ([`kvslim_engine::context::Context`]) and the
/// model it belongs to. Each question runs on a fork; the context never
/// changes.
#[pyclass(frozen, module = "kvslim._native")]
struct Context {
    /// Questions from several Python threads run on it at once (each on
    /// its own fork, with the GIL released); the properties read the
    /// copies below.
    ctx: EngineContext,
    model: Py<Model>,
    tokens: Vec<u32>,
    policy: String,
    chat: bool,
    kv_bytes: KvBytes,
    kv_bytes_full: usize,
    /// Seconds `Model.compress` took (`None` for a loaded context).
    compress_seconds: Option<f64>,
}

impl Context {
    fn new(ctx: EngineContext, model: Py<Model>, compress_seconds: Option<f64>) -> Self {
        Context {
            tokens: ctx.tokens().to_vec(),
            policy: ctx.policy().to_string(),
            chat: ctx.meta().pointer("/framing/kind").and_then(Value::as_str) == Some("chat"),
            kv_bytes: ctx.kv_bytes(),
            kv_bytes_full: ctx.kv_bytes_full(),
            ctx,
            model,
            compress_seconds,
        }
    }

    fn engine(&self) -> &EngineContext {
        &self.ctx
    }
}

#[pymethods]
impl Context {
    /// Answers `question` on a fork of the context (the context's policy
    /// keeps running; the context does not change), as `kvslim generate
    /// --context` does: stops at EOS, the chat's end-of-turn markers or
    /// after `max_tokens`. Returns `Model.generate`'s dict, with
    /// `prompt_token_ids` the context's tokens then the question's, and
    /// `question_token_ids` the question's.
    #[pyo3(signature = (question, max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=0))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        question: QuestionArg,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let m = self.model.get();
        let tok = m.tokenizer()?;
        let messages: Vec<ChatMessage> = match &question {
            QuestionArg::Text(_) => Vec::new(),
            QuestionArg::Messages(ms) => ms.iter().map(|(r, c)| ChatMessage::new(r.as_str(), c.as_str())).collect(),
        };
        let (q, g, text) = run_detached(py, || -> PyResult<_> {
            let ctx = self.engine();
            let chat = m.chat_format()?;
            let asked = match &question {
                QuestionArg::Text(t) => Question::Text(t),
                QuestionArg::Messages(_) => Question::Messages(&messages),
            };
            let q = ctx.question_tokens(tok, chat, asked).map_err(engine_error)?;
            let opts = GenerateOptions {
                max_tokens,
                sampling: SamplingParams { temperature, top_k, top_p, seed },
                policy: ctx.policy().clone(),
                eos: chat.stop_ids(tok),
            };
            // stop strings as the CLI stops on them: when the streamed
            // text holds one, cut there
            let stops = chat.stops();
            let mut stream = kvslim_models::tokenizer::StreamDecoder::new();
            let mut shown = String::new();
            let g = ctx
                .generate(&m.loaded.model, &q, &opts, |id| {
                    if let Ok(piece) = stream.push(tok, id) {
                        shown.push_str(&piece);
                    }
                    !stops.iter().any(|s| shown.contains(s.as_str()))
                })
                .map_err(engine_error)?;
            let mut text = tok.decode(&g.token_ids).map_err(model_error)?;
            chat.cut_at_stop(&mut text);
            Ok((q, g, text))
        })?;
        let d = PyDict::new(py);
        d.set_item("text", text)?;
        d.set_item("token_ids", &g.token_ids)?;
        let prompt: Vec<u32> = self.tokens.iter().chain(&q).copied().collect();
        d.set_item("prompt_token_ids", prompt)?;
        d.set_item("stop_reason", to_py(py, &json_of(&g.stop)?)?)?;
        d.set_item("policy", &self.policy)?;
        d.set_item("time_to_first_token_s", g.time_to_first_token_s)?;
        d.set_item("decode_s", g.decode_s)?;
        d.set_item("kv_bytes_allocated", g.kv_bytes.kv)?;
        d.set_item("kv_metadata_bytes", g.kv_bytes.metadata)?;
        d.set_item("speculative", py.None())?;
        d.set_item("question_token_ids", q)?;
        Ok(d)
    }

    /// Writes the context to `path` in the format of `kvslim compress -o`
    /// (through a temporary file beside it, renamed into place).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        run_detached(py, || -> PyResult<()> {
            let bytes = self.engine().to_bytes().map_err(engine_error)?;
            let io = |e: std::io::Error| io_error(format!("cannot write {}: {e}", path.display()), e.kind());
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &bytes).map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                io(e)
            })
        })
    }

    /// The model the context belongs to.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<Model> {
        self.model.clone_ref(py)
    }

    /// How many tokens the context holds.
    #[getter]
    fn tokens(&self) -> usize {
        self.tokens.len()
    }

    /// The context's token ids.
    #[getter]
    fn token_ids(&self) -> Vec<u32> {
        self.tokens.clone()
    }

    /// The policy it was compressed under (canonical spec).
    #[getter]
    fn policy(&self) -> &str {
        &self.policy
    }

    /// Whether the text was framed as a chat's first messages.
    #[getter]
    fn chat(&self) -> bool {
        self.chat
    }

    /// Allocated K/V bytes of the kept cache.
    #[getter]
    fn kv_bytes(&self) -> usize {
        self.kv_bytes.kv
    }

    /// Position and score bytes beside the kept K/V.
    #[getter]
    fn kv_metadata_bytes(&self) -> usize {
        self.kv_bytes.metadata
    }

    /// K/V bytes the full cache would hold for the same tokens.
    #[getter]
    fn kv_bytes_full(&self) -> usize {
        self.kv_bytes_full
    }

    /// Seconds the compression took (`None` for a loaded context).
    #[getter]
    fn compress_seconds(&self) -> Option<f64> {
        self.compress_seconds
    }
}

/// Sets the number of engine worker threads (once, before any work;
/// default: all cores).
#[pyfunction]
fn set_threads(n: usize) -> PyResult<()> {
    if n == 0 {
        return Err(value_error("threads must be at least 1"));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot set threads: {e} (set them before any work)")))
}

/// Checks a policy spec and returns its canonical form (`ValueError` when
/// it does not parse or its CHAI plan cannot be read).
#[pyfunction]
fn normalize_policy(spec: &str) -> PyResult<String> {
    Ok(parse_policy(spec)?.to_string())
}

/// The built-in model aliases: `(name, description)` pairs.
#[pyfunction]
fn aliases() -> Vec<(&'static str, &'static str)> {
    kvslim_hub::known_aliases().to_vec()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Context>()?;
    m.add_function(wrap_pyfunction!(set_threads, m)?)?;
    m.add_function(wrap_pyfunction!(normalize_policy, m)?)?;
    m.add_function(wrap_pyfunction!(aliases, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
