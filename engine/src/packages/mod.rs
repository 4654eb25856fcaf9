//! The Package rules: what ObjectDeployment a Package's unpacked contents make, and the Package's status.

pub mod package_deployment;
