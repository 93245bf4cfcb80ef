// Drives AbstractChat, the engine inside useChat, with its DefaultChatTransport against a streamengine app.
// node chat.mjs <ai5|ai6|ai7> <api url> [--id=CHAT_ID] <prompt, --resume, --regenerate, --history=JSON, --file=TYPE,URL,
//   --approve or --deny=REASON (answer the held calls: addToolApprovalResponse, then the automatic request)> [...]
//   ->  one JSON line: status, error, messages.
const [pkg, api, ...args] = process.argv.slice(2);
const chatId = args.find((arg) => arg.startsWith('--id='))?.slice('--id='.length);  // useChat({ id })
const prompts = args.filter((arg) => !arg.startsWith('--id='));
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } = await import(pkg);

class State {
  constructor() { this.status = 'ready'; this.error = undefined; this.messages = []; }
  pushMessage(message) { this.messages = this.messages.concat(message); }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(thing) { return structuredClone(thing); }
}

class Chat extends AbstractChat {
  constructor(init) { super({ ...init, state: new State() }); }
}

const errors = [];
const finishes = [];
let settled = () => {};
const chat = new Chat({
  ...(chatId ? { id: chatId } : {}),
  transport: new DefaultChatTransport({ api }),
  onError: (error) => { errors.push(String(error?.message ?? error)); settled(); },
  onFinish: (options) => {
    finishes.push({ isError: options.isError ?? null, finishReason: options.finishReason ?? null });
    settled();
  },
  // useChat({ sendAutomaticallyWhen }): the request that carries the approvals goes out by itself
  ...(lastAssistantMessageIsCompleteWithApprovalResponses
    ? { sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses } : {}),
});

async function answerHeldCalls(approved, reason) {
  const held = chat.messages.at(-1).parts.filter((part) => part.state === 'approval-requested');
  if (!held.length) throw new Error('no tool part is waiting for an approval');
  const answered = new Promise((resolve) => { settled = resolve; });
  for (const part of held) {
    await chat.addToolApprovalResponse({ id: part.approval.id, approved, ...(reason ? { reason } : {}) });
  }
  await answered;  // the automatic request's stream finished (or failed)
  settled = () => {};
}
let files = [];
for (const text of prompts) {
  if (text.startsWith('--file=')) {
    const [mediaType, url] = text.slice('--file='.length).split(/,(.*)/s);
    files.push({ type: 'file', mediaType, url });  // what useChat's sendMessage({ text, files }) sends
  } else if (text === '--resume') {
    await chat.resumeStream();  // what useChat({ resume: true }) does on mount
  } else if (text.startsWith('--history=')) {
    chat.messages = JSON.parse(text.slice('--history='.length));  // what useChat({ messages }) starts from
  } else if (text === '--approve' || text.startsWith('--deny=')) {
    await answerHeldCalls(text === '--approve', text.startsWith('--deny=') ? text.slice('--deny='.length) : undefined);
  } else if (text === '--regenerate') {
    await chat.regenerate();  // useChat's regenerate(): the last answer again
  } else {
    await chat.sendMessage(files.length ? { text, files } : { text });
    files = [];
  }
}
process.stdout.write(JSON.stringify({
  status: chat.status, error: chat.error ? String(chat.error.message) : null, errors, finishes,
  messages: chat.messages,
}) + '\n');
