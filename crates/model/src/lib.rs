//! The usermm cost model: what the engine's exact counters cost on a real kernel.
//!
//! | module | what |
//! |---|---|
//! | [`fit`] | per-event prices fitted to probe timings: NNLS with a ridge pull toward the recipes, λ by leaving one probe family out |
//! | [`prices`] | the machine's primitive costs, the recipes (Linux 6.18's work per counter event, in primitives) and the recipe prediction |
//! | [`profile`] | a machine profile: fingerprint, probe points, fitted prices; read as hostile input, cached safely |
//! | [`recipe_symbols`] | whether the running kernel inlines what the recipes' call counts assume |

pub mod fit;
pub mod prices;
pub mod profile;
pub mod recipe_symbols;
