//! The functional core: rules as plain functions over plain data, with no I/O and no actors. A folder
//! per domain; the modules at the top are shared by several.

pub mod fleet;
pub mod hypershift;
pub mod notifications;
pub mod objects;
pub mod packages;
pub mod rollout;
pub mod sharding;

pub mod api_time;
pub mod conditions;
pub mod label_selector;
pub mod resource_version;
pub mod sighting;
pub mod status_hold;
pub mod transition_events;
