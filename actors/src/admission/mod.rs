//! The validating admission webhook the manager serves: it refuses updates that change the immutable
//! spec fields of ObjectSets and ObjectSetPhases (and their Cluster variants), which upstream declares
//! as CRD validation rules that kube-apiserver 1.20 cannot evaluate.
//!
//! Owns the TLS identity (`cert_material` issues it, `serving_cert` keeps it in its Secret and the
//! caBundle) and the listener (`webhook_server`); the rule itself is
//! `engine::objects::immutable_fields`.

pub mod cert_material;
pub mod serving_cert;
pub mod webhook_server;
