//! Files in messages: documents (PDF, plain text, CSV, …) and audio, beside text and
//! images.
//!
//! A [`FileContent`] carries its bytes base64-encoded with its media type and name.
//! Each provider sends it in its own form (OpenAI chat `file` and `input_audio`
//! parts, Responses `input_file`, Anthropic `document` blocks, Gemini `inlineData`,
//! Bedrock `document` blocks); a provider that does not take a file of that type
//! refuses the request with [`StreamError::UnsupportedFile`](crate::StreamError),
//! naming itself and the type, before anything is sent.
//!
//! ```
//! use tiller_ai::{Content, FileContent, UserMessage};
//!
//! let pdf = FileContent::from_bytes("report.pdf", b"%PDF-1.4 ...").unwrap();
//! assert_eq!(pdf.mime_type, "application/pdf");
//! let message = UserMessage::text("What does the report conclude?").with_file(pdf);
//! assert!(matches!(message.content[1], Content::File(_)));
//! ```

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// The largest file a message may carry, in bytes before encoding: 32 MiB (a
/// provider's own, smaller limit, such as Bedrock's 4.5 MB a document or a
/// request limit its base64 passes, is its 4xx).
pub const MAX_FILE_BYTES: usize = 32 * 1024 * 1024;

/// The most files one message may carry.
pub const MAX_MESSAGE_FILES: usize = 16;

/// The most bytes (before encoding) the files of one message may come to.
pub const MAX_MESSAGE_FILE_BYTES: usize = 2 * MAX_FILE_BYTES;

/// The longest file name kept, in bytes.
pub const MAX_FILE_NAME_BYTES: usize = 255;

/// A file in a message: its bytes base64-encoded, its media type and its name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileContent {
    /// The bytes, base64-encoded.
    pub data: String,
    /// The media type, such as `application/pdf`, `text/plain` or `audio/wav`.
    pub mime_type: String,
    /// The file's name, such as `report.pdf` (providers show it to the model).
    pub name: String,
}

/// Why bytes could not become a [`FileContent`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("could not read {path}: {message}")]
    Read {
        /// The path given.
        path: String,
        /// What the system said.
        message: String,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("{name} is {bytes} bytes, more than the {limit} bytes a message may carry")]
    TooLarge {
        /// The file's name.
        name: String,
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The name has no extension Tiller knows a media type for (see [`media_type_of`]).
    #[error(
        "no media type known for {name}: Tiller knows .pdf, .txt, .md, .csv, .html, .json, .xml, .doc, .docx, .xls, .xlsx, .wav, .mp3, .flac, .ogg and .m4a"
    )]
    UnknownType {
        /// The file's name.
        name: String,
    },
    /// The name is empty, longer than [`MAX_FILE_NAME_BYTES`], or has a control character.
    #[error("a file name must be 1 to {MAX_FILE_NAME_BYTES} bytes with no control characters")]
    BadName,
    /// The data of a file that came from outside is not base64.
    #[error("the data of {name} is not base64")]
    NotBase64 {
        /// The file's name.
        name: String,
    },
    /// The media type is not of the form `type/subtype`, or is an image (images
    /// are [`ImageContent`](crate::ImageContent)).
    #[error("`{mime_type}` is not a file's media type (type/subtype; images are image content)")]
    BadType {
        /// The media type given.
        mime_type: String,
    },
}

impl FileContent {
    /// A file of `bytes` named `name`, its media type known from the name's extension.
    pub fn from_bytes(name: impl Into<String>, bytes: &[u8]) -> Result<Self, FileError> {
        let name = name.into();
        let mime_type =
            media_type_of(&name).ok_or_else(|| FileError::UnknownType { name: name.clone() })?;
        Self::with_type(name, mime_type, bytes)
    }

    /// A file of `bytes` named `name` with the media type given.
    pub fn with_type(
        name: impl Into<String>,
        mime_type: impl Into<String>,
        bytes: &[u8],
    ) -> Result<Self, FileError> {
        let name = name.into();
        let mime_type = mime_type.into();
        check_name(&name)?;
        check_type(&mime_type)?;
        if bytes.len() > MAX_FILE_BYTES {
            return Err(FileError::TooLarge {
                name,
                bytes: bytes.len(),
                limit: MAX_FILE_BYTES,
            });
        }
        Ok(FileContent {
            data: STANDARD.encode(bytes),
            mime_type,
            name,
        })
    }

    /// The file at `path`, named by its last component, its media type known from
    /// its extension. A file past [`MAX_FILE_BYTES`] is refused before it is read.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, FileError> {
        let path = path.as_ref();
        let read_error = |error: std::io::Error| FileError::Read {
            path: path.display().to_string(),
            message: error.to_string(),
        };
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let size = std::fs::metadata(path).map_err(read_error)?.len();
        if size > MAX_FILE_BYTES as u64 {
            return Err(FileError::TooLarge {
                name,
                bytes: usize::try_from(size).unwrap_or(usize::MAX),
                limit: MAX_FILE_BYTES,
            });
        }
        let bytes = std::fs::read(path).map_err(read_error)?;
        Self::from_bytes(name, &bytes)
    }

    /// Checks a file that came from outside (deserialized): its name, its media
    /// type, that its data is base64 and its size within [`MAX_FILE_BYTES`].
    pub fn validate(&self) -> Result<(), FileError> {
        check_name(&self.name)?;
        check_type(&self.mime_type)?;
        let bytes = self.size();
        if bytes > MAX_FILE_BYTES {
            return Err(FileError::TooLarge {
                name: self.name.clone(),
                bytes,
                limit: MAX_FILE_BYTES,
            });
        }
        if STANDARD.decode(&self.data).is_err() {
            return Err(FileError::NotBase64 {
                name: self.name.clone(),
            });
        }
        Ok(())
    }

    /// The file's size in bytes, decoded.
    pub fn size(&self) -> usize {
        let padding = self.data.bytes().rev().take_while(|&b| b == b'=').count();
        (self.data.len() / 4 * 3).saturating_sub(padding)
    }

    /// The decoded bytes.
    pub fn bytes(&self) -> Vec<u8> {
        STANDARD.decode(&self.data).unwrap_or_default()
    }

    /// Whether the file is audio.
    pub fn is_audio(&self) -> bool {
        self.mime_type.starts_with("audio/")
    }

    /// Whether the file is a PDF.
    pub fn is_pdf(&self) -> bool {
        self.mime_type == "application/pdf"
    }
}

/// The media type for a file name's extension, for the types providers take.
pub fn media_type_of(name: &str) -> Option<&'static str> {
    let extension = Path::new(name).extension()?.to_str()?.to_ascii_lowercase();
    Some(match extension.as_str() {
        "pdf" => "application/pdf",
        "txt" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "json" => "application/json",
        "xml" => "text/xml",
        "doc" => "application/msword",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xls" => "application/vnd.ms-excel",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "wav" => "audio/wav",
        "mp3" => "audio/mpeg",
        "flac" => "audio/flac",
        "ogg" => "audio/ogg",
        "m4a" => "audio/mp4",
        _ => return None,
    })
}

fn check_name(name: &str) -> Result<(), FileError> {
    if name.is_empty() || name.len() > MAX_FILE_NAME_BYTES || name.chars().any(char::is_control) {
        return Err(FileError::BadName);
    }
    Ok(())
}

fn check_type(mime_type: &str) -> Result<(), FileError> {
    let valid = mime_type.split_once('/').is_some_and(|(kind, subtype)| {
        let token = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
        };
        token(kind) && token(subtype) && kind != "image"
    });
    if valid {
        Ok(())
    } else {
        Err(FileError::BadType {
            mime_type: mime_type.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_typed_by_its_name_and_bounded() {
        let file = FileContent::from_bytes("Notes.TXT", b"hello").unwrap();
        assert_eq!(file.mime_type, "text/plain");
        assert_eq!(file.data, "aGVsbG8=");
        assert_eq!(file.size(), 5);
        assert_eq!(file.bytes(), b"hello");
        assert_eq!(
            FileContent::from_bytes("photo.heic", b"x"),
            Err(FileError::UnknownType {
                name: "photo.heic".into()
            })
        );
        assert_eq!(
            FileContent::with_type("a.png", "image/png", b"x"),
            Err(FileError::BadType {
                mime_type: "image/png".into()
            })
        );
        assert_eq!(
            FileContent::with_type("", "text/plain", b"x"),
            Err(FileError::BadName)
        );
        let big = vec![0u8; MAX_FILE_BYTES + 1];
        assert_eq!(
            FileContent::from_bytes("big.pdf", &big),
            Err(FileError::TooLarge {
                name: "big.pdf".into(),
                bytes: MAX_FILE_BYTES + 1,
                limit: MAX_FILE_BYTES
            })
        );
    }

    #[test]
    fn a_deserialized_file_is_validated() {
        let mut file = FileContent::from_bytes("a.pdf", b"%PDF").unwrap();
        assert_eq!(file.validate(), Ok(()));
        file.data = "not base64!".into();
        assert_eq!(
            file.validate(),
            Err(FileError::NotBase64 {
                name: "a.pdf".into()
            })
        );
        file.mime_type = "pdf".into();
        assert!(matches!(file.validate(), Err(FileError::BadType { .. })));
    }

    #[test]
    fn a_missing_file_says_where() {
        let error = FileContent::read("/no/such/file.pdf").unwrap_err();
        assert!(
            matches!(&error, FileError::Read { path, .. } if path == "/no/such/file.pdf"),
            "{error:?}"
        );
    }
}
