// A minimal React page on the real useChat hook (@ai-sdk/react 4, ai 7), bundled by esbuild at test time
// (tests/web/test_frontend_browser.py) and served beside the app: the chat posts to window.CHAT_API.
import React, { useState } from 'react';
import { createRoot } from 'react-dom/client';
import { useChat } from '@ai-sdk/react';
import { DefaultChatTransport } from 'ai';

function Part({ part }) {
  if (part.type === 'text') return <span className="text">{part.text}</span>;
  if (part.type.startsWith('tool-')) {
    return <span className="tool" data-state={part.state}>{part.type.slice(5)}: {String(part.output ?? '')}</span>;
  }
  return null;
}

function Chat() {
  const { messages, sendMessage, status, error } = useChat({
    transport: new DefaultChatTransport({ api: window.CHAT_API }),
  });
  const [input, setInput] = useState('');
  const send = (event) => {
    event.preventDefault();
    sendMessage({ text: input });
    setInput('');
  };
  return (
    <main>
      <p id="status">{status}</p>
      {error ? <p id="error">{error.message}</p> : null}
      <ol id="messages">
        {messages.map((message) => (
          <li key={message.id} className={message.role}>
            {message.parts.map((part, index) => <Part key={index} part={part} />)}
          </li>
        ))}
      </ol>
      <form onSubmit={send}>
        <input id="prompt" value={input} onChange={(event) => setInput(event.target.value)} />
        <button id="send" type="submit" disabled={status !== 'ready' && status !== 'error'}>Send</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById('root')).render(<Chat />);
