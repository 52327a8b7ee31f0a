//! What the actors' unit tests share: the engines they launch.

use std::sync::Arc;
use xinf_engine::Engines;
use xinf_engine_mock::MockLoader;

/// The mock engine, standing in under the default engine's name and knowing the default model,
/// so launches read as users write them.
pub(crate) fn engines() -> Engines {
    Engines::new(vec![Arc::new(MockLoader::named("native").knowing(&["smollm2-instruct"]))])
}
