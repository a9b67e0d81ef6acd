//! Chat prompts → text. Two formats:
//!
//! * **ChatML** (`<|im_start|>role\ncontent<|im_end|>\n` …, then
//!   `<|im_start|>assistant\n`), used when the tokenizer's chat template
//!   mentions `<|im_start|>` (SmolLM2 and other ChatML models). The Jinja
//!   template itself is not executed.
//! * **Plain**, for every other model: one `role: content` line per
//!   message, then `assistant:`.

/// One chat message.
#[derive(Clone, Debug)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Which template a tokenizer's `chat_template` string selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatFormat {
    ChatMl,
    Plain,
}

impl ChatFormat {
    pub fn detect(template: Option<&str>) -> Self {
        match template {
            Some(t) if t.contains("<|im_start|>") => ChatFormat::ChatMl,
            _ => ChatFormat::Plain,
        }
    }

    /// The prompt text for `messages`, ending where the assistant's reply starts.
    pub fn render(self, messages: &[ChatMessage]) -> String {
        let mut s = String::new();
        match self {
            ChatFormat::ChatMl => {
                for m in messages {
                    s.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content));
                }
                s.push_str("<|im_start|>assistant\n");
            }
            ChatFormat::Plain => {
                for m in messages {
                    s.push_str(&format!("{}: {}\n", m.role, m.content));
                }
                s.push_str("assistant:");
            }
        }
        s
    }

    /// Stop strings implied by the format (the end-of-turn marker).
    pub fn stops(self) -> Vec<String> {
        match self {
            ChatFormat::ChatMl => vec!["<|im_end|>".into()],
            ChatFormat::Plain => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_and_plain() {
        let msgs = vec![
            ChatMessage { role: "system".into(), content: "Be brief.".into() },
            ChatMessage { role: "user".into(), content: "Hi".into() },
        ];
        let t = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
        assert_eq!(ChatFormat::detect(Some(t)), ChatFormat::ChatMl);
        assert_eq!(
            ChatFormat::ChatMl.render(&msgs),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(ChatFormat::detect(None), ChatFormat::Plain);
        assert_eq!(ChatFormat::Plain.render(&msgs), "system: Be brief.\nuser: Hi\nassistant:");
    }
}
