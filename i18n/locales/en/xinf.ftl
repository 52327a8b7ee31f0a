# Errors: one message per error code of the engine and model layers.
error-prefix = error
error-invalid-request = invalid value for `{ $field }`: { $reason }
error-context-length = the prompt has { $prompt } tokens and max_tokens asks for { $max } more, over the context length of { $context } tokens
error-overloaded = the engine is overloaded ({ $queued } requests waiting, limit { $limit }); retry later
error-duplicate-request = a request with id `{ $id }` is already running
error-unknown-request = no request with id `{ $id }`
error-aborted = the request was aborted
error-model = cannot load the model: { $detail }
error-engine-stopped = the engine has stopped
error-kv-import = imported KV cache rejected: { $detail }
error-internal = internal error: { $detail }
error-usage = { $detail }
# CLI output.
cli-resolving = Resolving model { $name }…
cli-loading = Loading { $path } ({ $origin })…
cli-loaded = Loaded { $arch } ({ $layers } layers) in { $secs } s; KV cache { $layout }, { $dtype }
cli-finished = [{ $reason }: { $prompt } prompt tokens, { $completion } generated, { $tps } tokens/s]
cli-prompt-or-chat = give exactly one of --prompt or --chat
