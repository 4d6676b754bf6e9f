//! `rlx serve`: the OpenAI-compatible HTTP server.

use std::sync::Arc;

use anyhow::{Context, Result};
use rlx_server::{EngineOptions, RequestLog, Server, ServerOptions};

use super::common::{chat_template, tuning_note, ModelArgs, TemplateArgs};
use super::sample_args::SampleArgs;

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Defaults for the fields a request leaves out (`-n` is the default
    /// `max_tokens`).
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub template: TemplateArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// K/V tokens of all requests together (split evenly between the
    /// `--parallel` requests, as llama-server's `-c` with `-np`).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 8192)]
    pub ctx: usize,
    /// Requests generated at once (default: one per 2,048 tokens of `-c`,
    /// at most 16).
    #[arg(long = "parallel", visible_alias = "np")]
    pub parallel: Option<usize>,
    /// Requests that may wait for a place; more get 429 with Retry-After.
    #[arg(long = "max-queue", default_value_t = 64)]
    pub max_queue: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    #[arg(long = "max-body", default_value_t = 4 << 20)]
    pub max_body: usize,
    /// Do not serve the chat page at `/`.
    #[arg(long = "no-webui")]
    pub no_webui: bool,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    if args.ctx == 0 || args.parallel == Some(0) {
        anyhow::bail!("-c and --parallel must be at least 1");
    }
    // A missing file or template is an error before anything listens.
    super::common::resolve_model(&args.model.model)?;
    let chosen = args.template.chosen()?;
    let name = args
        .model
        .model
        .file_stem()
        .map_or_else(|| "model".to_owned(), |s| s.to_string_lossy().into_owned());
    let parallel = args.parallel.unwrap_or((args.ctx / 2048).clamp(1, 16));
    let mut opts = ServerOptions {
        sampling: args.sample.sampler_config(),
        max_tokens: args.sample.n,
        on_request: Some(Arc::new(|r: &RequestLog| eprintln!("{r}"))),
        api_key: args.api_key.clone(),
        max_body_bytes: args.max_body,
        webui: !args.no_webui,
        ..ServerOptions::new(name)
    };
    let (model_args, ctx, max_queue) = (args.model.clone(), args.ctx, args.max_queue);
    let webui = !args.no_webui;
    let sample = args.sample.clone();
    // The model loads while the port already answers /health with 503.
    let load = move || -> Result<Server> {
        let model = model_args.load_for(Some(ctx))?;
        let chosen_given = chosen.is_some();
        let template = chat_template(chosen, model.file())?;
        if let Some(note) = tuning_note(model.file(), &model_args.model, &template, chosen_given) {
            eprintln!("{note}");
        }
        opts.chat_template = Some(Arc::new(template));
        let tok = rlx_tokenizer::Tokenizer::from_gguf(model.file())?;
        let draft = sample.draft_model(&model_args, &tok, Some(ctx))?;
        let context = (ctx / parallel)
            .max(1)
            .min(model.config().context_length.max(1));
        let gpu = model.device() != rlx_gemma::Device::Cpu;
        let engine = EngineOptions {
            parallel,
            context,
            kv_types: model_args.kv_types(&model),
            max_queue,
            speculation: sample.speculation(model_args.batch_invariant, gpu)?,
            ..EngineOptions::default()
        };
        let server = Server::with_draft(model, draft, engine, opts)?;
        eprintln!("ready: {parallel} requests at once, {context} tokens each");
        Ok(server)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!("listening on http://{local} (loading the model); Ctrl-C or SIGTERM stops");
        if webui {
            eprintln!("chat page: http://{local}/");
        }
        let loading = async move {
            match tokio::task::spawn_blocking(load).await {
                Ok(Ok(server)) => Ok(Arc::new(server)),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(e) => Err(format!("loading failed: {e}")),
            }
        };
        // Ctrl-C or SIGTERM: no new connections; running requests finish.
        let shutdown = async {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{signal, SignalKind};
                match signal(SignalKind::terminate()) {
                    Ok(mut term) => {
                        tokio::select! {
                            _ = tokio::signal::ctrl_c() => {}
                            _ = term.recv() => {}
                        }
                    }
                    Err(_) => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
            }
        };
        rlx_server::serve_loading(listener, webui, loading, shutdown)
            .await
            .context("server failed")
    })
}
