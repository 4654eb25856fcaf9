//! A rollout event as the HTTP request of a CloudEvents 1.0 binary-mode delivery: each attribute a
//! `ce-` header, the data (the event as the stream holds it) the body, `Content-Type: application/json`.
//! Built with the `cloudevents-sdk` crate's event model and HTTP binding; sending is the caller's.

use cloudevents::binding::http::{Builder, Serializer};
use cloudevents::message::BinaryDeserializer;
use cloudevents::{EventBuilder, EventBuilderV10};
use http::header::HeaderValue;
use pko_proto::core::rollout_notifications::CloudEventAttributes;
use pko_proto::rollout_events::RolloutEvent;

/// The headers and body of one delivery.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CloudEventRequest {
    pub headers: Vec<(String, HeaderValue)>,
    pub body: Vec<u8>,
}

/// Collects what the SDK's binary-mode serializer writes.
#[derive(Default)]
struct Collected {
    headers: Vec<(String, HeaderValue)>,
}

impl Builder<CloudEventRequest> for Collected {
    fn header(&mut self, key: &str, value: HeaderValue) {
        self.headers.push((key.to_owned(), value));
    }

    fn body(&mut self, bytes: Vec<u8>) -> cloudevents::message::Result<CloudEventRequest> {
        Ok(CloudEventRequest {
            headers: std::mem::take(&mut self.headers),
            body: bytes,
        })
    }

    fn finish(&mut self) -> cloudevents::message::Result<CloudEventRequest> {
        self.body(Vec::new())
    }
}

/// The delivery of `event` (`data`: its JSON as the stream holds it), stamped `time` (when the stream
/// stored it, RFC 3339) and carrying `traceparent` (the W3C distributed-tracing extension), if any.
pub fn cloudevent_request(
    event: &RolloutEvent,
    data: serde_json::Value,
    time: Option<&str>,
    traceparent: Option<&str>,
) -> Result<CloudEventRequest, String> {
    let attributes = CloudEventAttributes::of(event);
    let mut builder = EventBuilderV10::new()
        .id(attributes.id)
        .source(attributes.source)
        .ty(attributes.type_)
        .data("application/json", data);
    if let Some(subject) = attributes.subject {
        builder = builder.subject(subject);
    }
    if let Some(time) = time {
        builder = builder.time(time);
    }
    if let Some(traceparent) = traceparent {
        builder = builder.extension("traceparent", traceparent);
    }
    let event = builder
        .build()
        .map_err(|e| format!("building the CloudEvent: {e}"))?;
    BinaryDeserializer::deserialize_binary(event, Serializer::new(Collected::default()))
        .map_err(|e| format!("writing the CloudEvent as HTTP: {e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::rollout_events::{RolloutEventKind, EVENT_VERSION};

    #[test]
    fn binary_mode_puts_attributes_in_headers_and_the_event_in_the_body() {
        let event = RolloutEvent {
            version: EVENT_VERSION,
            kind: RolloutEventKind::GroupStarted,
            hosted_cluster_package: "addon".into(),
            uid: "u1".into(),
            generation: 2,
            group: Some("early".into()),
            namespace: None,
            message: String::new(),
            source: "mc-1".into(),
            trace_id: None,
            traceparent: None,
        };
        let data = serde_json::to_value(&event).unwrap();
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let request = cloudevent_request(
            &event,
            data.clone(),
            Some("2026-11-29T10:00:00Z"),
            Some(traceparent),
        )
        .unwrap();
        let header = |name: &str| {
            request
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_str().unwrap().to_owned())
        };
        assert_eq!(header("ce-specversion").as_deref(), Some("1.0"));
        assert_eq!(
            header("ce-id").as_deref(),
            Some("u1/2/group_started/early/-")
        );
        assert_eq!(
            header("ce-type").as_deref(),
            Some("run.package-operator.rollout.groupStarted")
        );
        assert_eq!(
            header("ce-source").as_deref(),
            Some("/management-clusters/mc-1/hostedclusterpackages/addon")
        );
        assert_eq!(header("ce-subject").as_deref(), Some("early"));
        assert_eq!(
            header("ce-time").as_deref(),
            Some("2026-11-29T10:00:00+00:00")
        );
        assert_eq!(header("ce-traceparent").as_deref(), Some(traceparent));
        assert_eq!(header("content-type").as_deref(), Some("application/json"));
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(body, data);
    }
}
