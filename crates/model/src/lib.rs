//! The usermm cost model: what the engine's exact counters cost on a real kernel.
//!
//! | module | what |
//! |---|---|
//! | [`prices`] | the machine's primitive costs, the recipes (Linux 6.18's work per counter event, in primitives) and the recipe prediction |
//! | [`recipe_symbols`] | whether the running kernel inlines what the recipes' call counts assume |

pub mod prices;
pub mod recipe_symbols;
