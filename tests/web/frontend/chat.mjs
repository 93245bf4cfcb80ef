// Drives AbstractChat, the engine inside useChat, with its DefaultChatTransport against a streamengine app.
// node chat.mjs <ai5|ai6|ai7> <api url> [--id=CHAT_ID] <prompt, --resume, --regenerate, --history=JSON or --file=TYPE,URL> [...]
//   ->  one JSON line: status, error, messages.
const [pkg, api, ...args] = process.argv.slice(2);
const chatId = args.find((arg) => arg.startsWith('--id='))?.slice('--id='.length);  // useChat({ id })
const prompts = args.filter((arg) => !arg.startsWith('--id='));
const { AbstractChat, DefaultChatTransport } = await import(pkg);

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
const chat = new Chat({
  ...(chatId ? { id: chatId } : {}),
  transport: new DefaultChatTransport({ api }),
  onError: (error) => errors.push(String(error?.message ?? error)),
  onFinish: (options) => finishes.push({ isError: options.isError ?? null, finishReason: options.finishReason ?? null }),
});
let files = [];
for (const text of prompts) {
  if (text.startsWith('--file=')) {
    const [mediaType, url] = text.slice('--file='.length).split(/,(.*)/s);
    files.push({ type: 'file', mediaType, url });  // what useChat's sendMessage({ text, files }) sends
  } else if (text === '--resume') {
    await chat.resumeStream();  // what useChat({ resume: true }) does on mount
  } else if (text.startsWith('--history=')) {
    chat.messages = JSON.parse(text.slice('--history='.length));  // what useChat({ messages }) starts from
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
