# 错误：引擎与模型层的每个错误码各一条消息。
error-prefix = 错误
error-invalid-request = 字段 `{ $field }` 的值无效：{ $reason }
error-context-length = 提示词有 { $prompt } 个 token，max_tokens 还要求 { $max } 个，超过了 { $context } 个 token 的上下文长度
error-overloaded = 引擎过载（{ $queued } 个请求在等待，上限 { $limit }），请稍后重试
error-duplicate-request = ID 为 `{ $id }` 的请求已在运行
error-unknown-request = 没有 ID 为 `{ $id }` 的请求
error-aborted = 请求已中止
error-model = 无法加载模型：{ $detail }
error-engine-stopped = 引擎已停止
error-kv-import = 导入的 KV 缓存被拒绝：{ $detail }
error-internal = 内部错误：{ $detail }
error-usage = { $detail }
# 命令行输出。
cli-resolving = 正在解析模型 { $name }…
cli-loading = 正在加载 { $path }（{ $origin }）…
cli-loaded = 已加载 { $arch }（{ $layers } 层），用时 { $secs } 秒；KV 缓存 { $layout }，{ $dtype }
cli-finished = [{ $reason }：提示词 { $prompt } 个 token，生成 { $completion } 个，每秒 { $tps } 个 token]
cli-prompt-or-chat = 请只给出 --prompt 或 --chat 之一
