//! Errors of the distributed layer.

pub type Result<T> = std::result::Result<T, DistError>;

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("{0}")]
    Config(String),
    #[error("MPI: {0}")]
    Mpi(String),
    #[error("NCCL: {0}")]
    Nccl(String),
    #[error("{var}=`{spec}`: {message}")]
    Fault {
        var: &'static str,
        spec: String,
        message: String,
    },
}
