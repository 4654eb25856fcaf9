//! Rollout events delivered to HTTP sinks as CloudEvents: each sink reads the rollout event stream
//! through a durable consumer of its own and POSTs every event it wants, once and in order, retrying with
//! backoff, off the rollout's path. Which sinks exist and what they want is
//! `engine::notifications::notification_sink`'s; these modules only carry events out.

pub mod cloudevent_request;
pub mod notification_sinks;
pub mod sink_addresses;
pub mod sink_credentials;
pub mod sink_delivery;
